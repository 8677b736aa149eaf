//! The runtime handle: a connected store, its journal writer, the registry and
//! this process's executor identity.

pub(crate) mod identity;
pub(crate) mod inflight;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro_store::{JournalWriter, SqliteSynchronous, Store, StoreOptions};
use tokio::sync::{watch, OnceCell};

use crate::registry::Registry;
use crate::{Error, Result};

/// The environment variable naming the database (default `sqlite:keiro.db`).
pub const DATABASE_URL_ENV: &str = "KEIRO_DATABASE_URL";
/// The environment variable naming this process's executor identity, held
/// exclusively (default: `{host}/{program}`, numbered `#2`, `#3`, … when
/// other live processes of the program on this host hold it; see
/// [`KeiroBuilder::executor_id`]).
pub const EXECUTOR_ID_ENV: &str = "KEIRO_EXECUTOR_ID";
/// The environment variable relaxing SQLite durability: `full` (default) or `normal`.
pub const SQLITE_SYNCHRONOUS_ENV: &str = "KEIRO_SQLITE_SYNCHRONOUS";
/// The database used when [`DATABASE_URL_ENV`] is unset: `keiro.db` in the
/// working directory, created if missing.
pub const DEFAULT_DATABASE_URL: &str = "sqlite:keiro.db";

/// The outcome of one in-process run, shared with every caller waiting on it.
pub(crate) type RunResult = Option<Result<keiro_store::InstanceRow>>;

/// A connected keiro runtime. Cheap to clone; every clone shares one store,
/// one journal writer and one registry.
#[derive(Clone)]
pub struct Keiro {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) writer: JournalWriter,
    pub(crate) registry: Registry,
    /// The identity asked for: explicit (exclusive) or the default base.
    pub(crate) requested_id: String,
    /// Whether `requested_id` was set explicitly, so no other is taken.
    pub(crate) exclusive: bool,
    pub(crate) lease_ttl: Duration,
    pub(crate) max_attempts: u32,
    /// Waits longer than this suspend the workflow instead of holding memory.
    pub(crate) suspend_after: Duration,
    /// How long a caller waits on a due instance that no live worker serves
    /// before `result()` says so.
    pub(crate) no_worker_timeout: Duration,
    /// Set once this process's resume worker has recorded the workflow names
    /// it serves.
    pub(crate) serving: OnceCell<()>,
    /// The identity this runtime took, once it runs workflows; read through
    /// [`Keiro::owner`].
    pub(crate) executor: OnceCell<crate::runtime::identity::Registration>,
    /// Set by [`Keiro::shutdown`]: in-process runs, workers and the heartbeat
    /// stop.
    pub(crate) stop: watch::Sender<bool>,
    /// Wakes this process's resume worker (work was enqueued here, or a
    /// notification arrived).
    pub(crate) wake: tokio::sync::Notify,
    /// Workflow runs of this process waiting in memory for a recorded step.
    pub(crate) waiters: crate::runtime::inflight::WaiterMap,
    /// Whether this runtime's PostgreSQL wake listener is started.
    pub(crate) listening: std::sync::atomic::AtomicBool,
    /// Live runs in this process, so a cancellation stops them at once.
    pub(crate) live: Mutex<HashMap<String, std::sync::Weak<crate::context::WorkflowContext>>>,
    /// Instances this process is running now, so a second caller attaches to
    /// the run in flight instead of starting another.
    pub(crate) running: Mutex<HashMap<String, (&'static str, watch::Receiver<RunResult>)>>,
}

impl std::fmt::Debug for Keiro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keiro")
            .field("backend", &self.inner.store.backend())
            .field("executor_id", &self.owner())
            .finish_non_exhaustive()
    }
}

impl Keiro {
    /// Connects to `url` (`sqlite:path`, `sqlite::memory:`, `postgres://…`),
    /// runs the migrations and collects the workflows linked into this binary.
    pub async fn connect(url: &str) -> Result<Keiro> {
        Keiro::builder(url).connect().await
    }

    /// Settings beyond the URL: executor identity, lease TTL, SQLite durability,
    /// pool size.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keiro::{Keiro, SqliteSynchronous};
    ///
    /// # async fn demo() -> Result<(), keiro::Error> {
    /// let keiro = Keiro::builder("sqlite:orders.db")
    ///     .sqlite_synchronous(SqliteSynchronous::Normal) // faster; may lose the last commits on power loss
    ///     .suspend_after(Duration::from_secs(5))
    ///     .max_attempts(3)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(url: impl Into<String>) -> KeiroBuilder {
        KeiroBuilder {
            url: url.into(),
            executor_id: None,
            lease_ttl: Duration::from_secs(10),
            max_attempts: 5,
            suspend_after: Duration::from_secs(1),
            no_worker_timeout: Duration::from_secs(30),
            store: StoreOptions::default(),
        }
    }

    /// Builds the process-wide default from the environment:
    /// [`DATABASE_URL_ENV`], [`EXECUTOR_ID_ENV`] and [`SQLITE_SYNCHRONOUS_ENV`].
    pub async fn from_env() -> Result<Keiro> {
        let (url, _) = env_database_url();
        let mut builder = Keiro::builder(url);
        if let Ok(id) = std::env::var(EXECUTOR_ID_ENV) {
            builder = builder.executor_id(id);
        }
        if let Ok(value) = std::env::var(SQLITE_SYNCHRONOUS_ENV) {
            builder = builder.sqlite_synchronous(match value.to_ascii_lowercase().as_str() {
                "full" => SqliteSynchronous::Full,
                "normal" => SqliteSynchronous::Normal,
                other => {
                    return Err(Error::Config(format!(
                        "{SQLITE_SYNCHRONOUS_ENV}=`{other}` is not a SQLite durability \
                         setting; use `full` or `normal`"
                    )))
                }
            });
        }
        builder.connect().await
    }

    /// The store this runtime journals into.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// This runtime's executor identity, the owner name on its leases: the
    /// one it took when it first ran a workflow (a default identity may carry
    /// a `#N` suffix), or before that, the one it will ask for first.
    pub fn executor_id(&self) -> &str {
        self.owner()
    }

    /// The names of the workflows linked into this binary, sorted.
    pub fn workflow_names(&self) -> Vec<&'static str> {
        self.inner.registry.names()
    }

    /// Puts an instance that was set aside for non-determinism back in line,
    /// journal intact, so the fixed code resumes it: the next call with its id
    /// (or a resume worker) runs it. Errors when no such instance is set aside.
    pub async fn resume(&self, id: &str) -> Result<()> {
        if self.inner.store.requeue_set_aside(id).await? {
            return Ok(());
        }
        match self.inner.store.get_instance(id).await? {
            None => Err(Error::NotFound { id: id.to_owned() }),
            Some(row) => Err(Error::Config(format!(
                "workflow `{}` (id {id}) is {}, not set aside for non-determinism; \
                 there is nothing to resume",
                row.name,
                row.status.as_str()
            ))),
        }
    }
}

/// Settings for [`Keiro::builder`].
#[derive(Debug, Clone)]
pub struct KeiroBuilder {
    url: String,
    executor_id: Option<String>,
    lease_ttl: Duration,
    max_attempts: u32,
    suspend_after: Duration,
    no_worker_timeout: Duration,
    store: StoreOptions,
}

impl KeiroBuilder {
    /// The owner name on this process's leases, held exclusively: a second
    /// live process asking for it is refused with [`Error::ExecutorIdInUse`],
    /// and a process restarting under it takes over its dead predecessor's
    /// leases at once (on the same host; after 10 s of silence from another).
    ///
    /// Default: [`EXECUTOR_ID_ENV`] if set (also exclusive), else
    /// `{host}/{program}` (the program being the executable's file stem). The
    /// default is shared: when a live process holds it, the first free of
    /// `{host}/{program}#2`, `#3`, … (64 at most) is taken, so any number of
    /// processes of one program run side by side on one host with no
    /// setting. A restarted process takes the lowest slot that is free or
    /// whose holder died, with that holder's leases, and releases the leases
    /// of every other slot of its program whose holder died on this host, so
    /// all their work resumes at once.
    pub fn executor_id(mut self, id: impl Into<String>) -> Self {
        self.executor_id = Some(id.into());
        self
    }

    /// How long a claim on a running instance lasts without renewal (default
    /// 10 s). A live run renews it every third of this, so only a dead
    /// executor's claims lapse.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How many crashes (panics) an instance run in this process may have
    /// before it is marked failed (default 5). A resume worker uses its own
    /// [`crate::ResumeOptions::max_attempts`].
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Waits (`keiro::sleep`) up to this long stay in memory; longer ones
    /// suspend the workflow: its future is dropped, its lease released, and it
    /// costs only its row until due (default 1 s).
    pub fn suspend_after(mut self, threshold: Duration) -> Self {
        self.suspend_after = threshold;
        self
    }

    /// How long [`WorkflowHandle::result`](crate::WorkflowHandle::result) waits
    /// on an instance that is due, held by nobody, and whose workflow name no
    /// live resume worker serves, before it returns [`Error::NoWorker`]
    /// (default 30 s). Nothing about the instance changes: it runs as soon as
    /// a worker that registers its name starts.
    pub fn no_worker_timeout(mut self, timeout: Duration) -> Self {
        self.no_worker_timeout = timeout;
        self
    }

    /// SQLite durability (default [`SqliteSynchronous::Full`]).
    pub fn sqlite_synchronous(mut self, sync: SqliteSynchronous) -> Self {
        self.store.sqlite_synchronous = sync;
        self
    }

    /// The connection pool's size (default 8 on PostgreSQL, 4 on SQLite).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.store.max_connections = Some(n);
        self
    }

    /// Validates the settings, connects, migrates and collects the registry.
    pub async fn connect(self) -> Result<Keiro> {
        if self.lease_ttl < Duration::from_millis(100) {
            return Err(Error::Config(format!(
                "lease_ttl of {:?} is too short; use at least 100 ms",
                self.lease_ttl
            )));
        }
        if self.max_attempts == 0 {
            return Err(Error::Config("max_attempts must be at least 1".into()));
        }
        let (requested_id, exclusive) = match self.executor_id.or_else(env_executor_id) {
            Some(id) if id.trim().is_empty() => {
                return Err(Error::Config("the executor id must not be empty".into()))
            }
            Some(id) => (id, true),
            None => (default_executor_id(), false),
        };
        let registry = Registry::collect()?;
        let store = Store::connect(&self.url, &self.store).await?;
        let writer = JournalWriter::spawn(store.clone());
        Ok(Keiro {
            inner: Arc::new(Inner {
                store,
                writer,
                registry,
                requested_id,
                exclusive,
                lease_ttl: self.lease_ttl,
                max_attempts: self.max_attempts,
                suspend_after: self.suspend_after,
                no_worker_timeout: self.no_worker_timeout,
                serving: OnceCell::new(),
                executor: OnceCell::new(),
                stop: watch::channel(false).0,
                wake: tokio::sync::Notify::new(),
                waiters: Mutex::new(HashMap::new()),
                listening: std::sync::atomic::AtomicBool::new(false),
                live: Mutex::new(HashMap::new()),
                running: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// [`EXECUTOR_ID_ENV`], when set to something.
fn env_executor_id() -> Option<String> {
    std::env::var(EXECUTOR_ID_ENV)
        .ok()
        .filter(|id| !id.trim().is_empty())
}

/// `{host}/{program}`: shared by the processes of one program on one host,
/// each taking a numbered slot of it.
fn default_executor_id() -> String {
    let program = std::env::current_exe()
        .ok()
        .or_else(|| std::env::args_os().next().map(Into::into))
        .and_then(|path| {
            path.file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
        })
        .filter(|stem| !stem.is_empty())
        .unwrap_or_else(|| "keiro".to_owned());
    format!("{}/{program}", host_name())
}

/// This machine's host name.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "keiro".to_owned())
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
    GLOBAL.set(keiro).map_err(|_| {
        Error::Config(
            "a process-wide keiro runtime is already installed; call keiro::init once, \
             before the first workflow runs"
                .into(),
        )
    })
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
