//! The process-wide default runtime: installed with [`init`], or built from
//! the environment on first use by [`global`].

use keiro_store::SqliteSynchronous;
use tokio::sync::OnceCell;

use super::Keiro;
use crate::{Error, Result};

/// The environment variable naming the database (default `sqlite:keiro.db`).
pub const DATABASE_URL_ENV: &str = "KEIRO_DATABASE_URL";
/// The environment variable naming this process's executor identity, held
/// exclusively (default: `{host}/{program}`, numbered `#2`, `#3`, … when
/// other live processes of the program on this host hold it; see
/// [`crate::KeiroBuilder::executor_id`]).
pub const EXECUTOR_ID_ENV: &str = "KEIRO_EXECUTOR_ID";
/// The environment variable relaxing SQLite durability: `full` (default) or `normal`.
pub const SQLITE_SYNCHRONOUS_ENV: &str = "KEIRO_SQLITE_SYNCHRONOUS";
/// The environment variable naming a direct PostgreSQL URL for `LISTEN` and
/// migrations when [`DATABASE_URL_ENV`] goes through a transaction-pooling
/// proxy (see [`crate::KeiroBuilder::listen_url`]).
pub const LISTEN_URL_ENV: &str = "KEIRO_LISTEN_URL";
/// The database used when [`DATABASE_URL_ENV`] is unset: `keiro.db` in the
/// working directory, created if missing.
pub const DEFAULT_DATABASE_URL: &str = "sqlite:keiro.db";

impl Keiro {
    /// Builds the process-wide default from the environment:
    /// [`DATABASE_URL_ENV`], [`EXECUTOR_ID_ENV`], [`SQLITE_SYNCHRONOUS_ENV`]
    /// and [`LISTEN_URL_ENV`].
    pub async fn from_env() -> Result<Keiro> {
        let (url, _) = env_database_url();
        // The executor identity comes from EXECUTOR_ID_ENV in
        // `KeiroBuilder::connect`, the one place it is read.
        let mut builder = Keiro::builder(url);
        if let Ok(value) = std::env::var(SQLITE_SYNCHRONOUS_ENV) {
            builder = builder.sqlite_synchronous(match value.to_ascii_lowercase().as_str() {
                "full" => SqliteSynchronous::Full,
                "normal" => SqliteSynchronous::Normal,
                other => {
                    return Err(Error::InvalidOption {
                        option: SQLITE_SYNCHRONOUS_ENV,
                        reason: format!(
                            "`{other}` is not a SQLite durability setting; use `full` or `normal`"
                        ),
                    })
                }
            });
        }
        if let Some(listen_url) = std::env::var(LISTEN_URL_ENV).ok().filter(|u| !u.is_empty()) {
            builder = builder.listen_url(listen_url);
        }
        builder.connect().await
    }
}

static GLOBAL: OnceCell<Keiro> = OnceCell::const_new();

/// Installs `keiro` as the process-wide runtime used by calls without `.on(..)`.
/// Errors if one is already installed.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), keiro::Error> {
/// let keiro = keiro::Keiro::builder("postgres://app@db/app")
///     .lease_ttl(Duration::from_secs(30))
///     .connect()
///     .await?;
/// keiro::init(keiro)?; // before the first workflow call
/// let worker = keiro::run_resume_worker().await?; // uses it
/// # worker.shutdown().await;
/// # Ok(()) }
/// ```
pub fn init(keiro: Keiro) -> Result<()> {
    GLOBAL.set(keiro).map_err(|_| Error::AlreadyInitialized)
}

/// The process-wide runtime: the one given to [`init`], else one built from the
/// environment by [`Keiro::from_env`] on first use, which logs at `info` which
/// database it opened and why (a workflow called with no runtime set up
/// creates `keiro.db` in the working directory).
///
/// ```no_run
/// # async fn demo() -> Result<(), keiro::Error> {
/// let keiro = keiro::global().await?;
/// println!("{} workflows linked: {:?}", keiro.store().backend(), keiro.workflow_names());
/// # Ok(()) }
/// ```
pub async fn global() -> Result<Keiro> {
    GLOBAL
        .get_or_try_init(|| async {
            let keiro = Keiro::from_env().await?;
            let (url, from_env) = env_database_url();
            let url = keiro_store::redact_url(&url);
            if from_env {
                tracing::info!(database = %url, "keiro opened the database named by {DATABASE_URL_ENV}");
            } else {
                let file = std::env::current_dir()
                    .map(|dir| dir.join("keiro.db").display().to_string())
                    .unwrap_or_else(|_| "keiro.db".to_owned());
                tracing::info!(
                    database = %url,
                    %file,
                    "keiro opened its default SQLite database ({DATABASE_URL_ENV} is unset; \
                     set it or call keiro::init to choose another)"
                );
            }
            Ok(keiro)
        })
        .await
        .cloned()
}

/// The database URL from [`DATABASE_URL_ENV`], else [`DEFAULT_DATABASE_URL`];
/// the flag says whether the environment named it.
fn env_database_url() -> (String, bool) {
    match std::env::var(DATABASE_URL_ENV) {
        Ok(url) if !url.is_empty() => (url, true),
        _ => (DEFAULT_DATABASE_URL.to_owned(), false),
    }
}

/// The process-wide runtime if one is set up, without creating one.
pub(crate) fn try_global() -> Option<Keiro> {
    GLOBAL.get().cloned()
}
