//! Shared helpers for keiro's integration tests: a fresh database per test on
//! each backend, and a side-effect log that tells which step bodies ran.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub mod executors;
pub mod process;
pub mod shared_name;
pub mod workflows;

use keiro::Keiro;

/// The PostgreSQL server the tests use; each test gets a fresh database on it.
pub const POSTGRES_URL_ENV: &str = "KEIRO_TEST_POSTGRES_URL";
/// Used when [`POSTGRES_URL_ENV`] is unset: the local server over its Unix
/// socket, as the current OS user.
pub const DEFAULT_POSTGRES_URL: &str = "postgres:///keiro_test";

/// A backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file in a temporary directory.
    Sqlite,
    /// A fresh database on the test PostgreSQL server.
    Postgres,
}

/// A fresh, empty database that lives as long as this value.
#[derive(Debug)]
pub struct TestDb {
    /// The URL to connect to it.
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// Creates a fresh database on `backend`. Panics with a message naming
    /// [`POSTGRES_URL_ENV`] when the PostgreSQL server cannot be reached.
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("create a temporary directory");
                let url = format!("sqlite:{}", dir.path().join("keiro.db").display());
                TestDb {
                    url,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => TestDb {
                url: fresh_postgres_database().await,
                _dir: None,
            },
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
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}

/// The base URL of the test PostgreSQL server.
pub fn postgres_base_url() -> String {
    std::env::var(POSTGRES_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned())
}

async fn fresh_postgres_database() -> String {
    use sqlx::Connection;
    let base = postgres_base_url();
    let mut admin = sqlx::PgConnection::connect(&base)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot reach the test PostgreSQL server at {base} ({e}); start it (`.ci/run` \
             does) or point {POSTGRES_URL_ENV} at one"
            )
        });
    let name = format!("keiro_t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create database {name} on {base}: {e}"));
    let _ = admin.close().await;
    with_database(&base, &name)
}

/// `url` with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match head[scheme_end..].find('/') {
        Some(slash) => &head[..scheme_end + slash],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
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

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_of_a_url() {
        assert_eq!(
            with_database("postgres:///keiro_test", "x"),
            "postgres:///x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/db?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
    }
}
