//! Shared helpers for keiro's integration tests: a fresh database per test on
//! each backend, and a side-effect log that tells which step bodies ran.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub mod deployments;
pub mod executors;
pub mod faketime;
pub mod faults;
pub mod operator;
pub mod pg_cluster;
pub mod pg_formation;
pub mod process;
pub mod queues;
pub mod shared_name;
pub mod tcp_proxy;
pub mod timers;
pub mod tls;
pub mod transactional;
pub mod warnings;
pub mod workflows;

use keiro::Keiro;
use keiro_test_support::{
    redact_url, PgBouncer, PostgresServer, TEST_DATABASE_PREFIX, TEST_POSTGRES_URL_VAR,
};

/// A backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file in a temporary directory.
    Sqlite,
    /// A fresh database on the test PostgreSQL server.
    Postgres,
    /// A fresh database on the test PostgreSQL server, reached through a
    /// pgbouncer in transaction pooling mode that the test process starts
    /// (`pooler=transaction`, no direct URL: workers poll).
    PgBouncer,
}

impl Backend {
    /// Whether the database is PostgreSQL (directly or through pgbouncer).
    pub fn is_postgres(self) -> bool {
        matches!(self, Backend::Postgres | Backend::PgBouncer)
    }
}

/// A fresh, empty database that lives as long as this value. Its `Debug`
/// hides the URL's credentials.
pub struct TestDb {
    /// The URL to connect to it.
    pub url: String,
    /// Its URL without pgbouncer (`url` itself on the other backends).
    pub direct_url: String,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl TestDb {
    /// Creates a fresh database on `backend`: a `keiro_t_<uuid>` database on the
    /// server `KEIRO_TEST_POSTGRES_URL` names, left for `.ci/run` to drop.
    /// Panics with a message naming that variable when the PostgreSQL server
    /// cannot be reached.
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("create a temporary directory");
                let url = format!("sqlite:{}", dir.path().join("keiro.db").display());
                TestDb {
                    direct_url: url.clone(),
                    url,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                let url = PostgresServer::from_env(TEST_POSTGRES_URL_VAR)
                    .create_database(TEST_DATABASE_PREFIX)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .url;
                TestDb {
                    direct_url: url.clone(),
                    url,
                    _dir: None,
                }
            }
            Backend::PgBouncer => {
                let server = PostgresServer::from_env(TEST_POSTGRES_URL_VAR);
                let fresh = server
                    .create_database(TEST_DATABASE_PREFIX)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                TestDb {
                    url: PgBouncer::shared(&server).url(&fresh.name),
                    direct_url: fresh.url,
                    _dir: None,
                }
            }
        }
    }

    /// A builder for a runtime on this database under a fresh test executor
    /// identity, for tests that set the instance policy.
    pub fn builder(&self) -> keiro::KeiroBuilder {
        Keiro::builder(&self.url).executor_id(format!("test-{}", uuid::Uuid::new_v4().simple()))
    }

    /// A runtime connected to this database with its own executor id.
    pub async fn keiro(&self) -> Keiro {
        self.builder()
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", redact_url(&self.url)))
    }
}

/// Records a pending instance `id` of workflow `name` with `input` straight in
/// `keiro`'s store (no signature, version or lease), as an older or another
/// binary would have left it.
pub async fn create_pending(keiro: &Keiro, id: &str, name: &str, input: &str) {
    keiro::unstable::raw_store(keiro)
        .create_instance(&keiro_store::NewInstance::new(id, name, input))
        .await
        .unwrap_or_else(|e| panic!("create pending instance `{id}`: {e}"));
}

fn log() -> &'static Mutex<HashMap<String, Vec<String>>> {
    static LOG: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    LOG.get_or_init(Default::default)
}

/// Records that `what` ran under test key `key` (step bodies call this).
pub fn ran(key: &str, what: &str) {
    log()
        .lock()
        .unwrap()
        .entry(key.to_owned())
        .or_default()
        .push(what.to_owned());
}

/// Everything recorded under `key`, in order.
pub fn runs(key: &str) -> Vec<String> {
    log().lock().unwrap().get(key).cloned().unwrap_or_default()
}

/// How many times `what` ran under `key`.
pub fn count(key: &str, what: &str) -> usize {
    runs(key).iter().filter(|w| *w == what).count()
}

/// Generates one `#[tokio::test]` per backend for each listed async fn taking a
/// [`Backend`]: `mod sqlite { fn name() }` and `mod postgres { fn name() }`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::Postgres).await
                }
            )*
        }
    };
}

/// Like [`on_both_backends!`], but one test per listed async fn,
/// `mod both { fn name() }`, that runs it on SQLite and on PostgreSQL at
/// once (see [`on_both_at_once`]): for cases that mostly wait on real time
/// (cron ticks, sleeps), whose waits then overlap instead of adding up.
#[macro_export]
macro_rules! on_both_backends_at_once {
    ($($name:ident),* $(,)?) => {
        mod both {
            $(
                // Two cases share the runtime: as many threads as two have.
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    $crate::on_both_at_once(super::$name).await
                }
            )*
        }
    };
}

/// Runs `case` on SQLite and on PostgreSQL at once, each on a task of its
/// own, and fails naming each backend whose run panicked (its panic is
/// printed above, as any test's).
pub async fn on_both_at_once<F, Fut>(case: F)
where
    F: Fn(Backend) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let sqlite = tokio::spawn(case(Backend::Sqlite));
    let postgres = tokio::spawn(case(Backend::Postgres));
    let (sqlite, postgres) = tokio::join!(sqlite, postgres);
    let failed: Vec<&str> = [("SQLite", sqlite), ("PostgreSQL", postgres)]
        .into_iter()
        .filter(|(_, ran)| ran.is_err())
        .map(|(backend, _)| backend)
        .collect();
    assert!(failed.is_empty(), "failed on {}", failed.join(" and "));
}

/// [`on_both_backends!`] plus `mod pgbouncer { fn name() }`: PostgreSQL
/// through a pgbouncer in transaction pooling mode.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        $crate::on_both_backends!($($name),*);
        mod pgbouncer {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::PgBouncer).await
                }
            )*
        }
    };
}
