//! Test databases for both backends: a fresh SQLite file or a fresh
//! PostgreSQL database per test.
//!
//! PostgreSQL is reached through `KEIRO_TEST_POSTGRES_URL` (default
//! `postgres:///keiro_test`: the local unix socket as the current OS user).
//! Each test creates its own `keiro_t_<uuid>` database there and drops it when
//! it passes; a failed test leaves its database behind for inspection (CI drops
//! every `keiro_t_%` database at the start of a run). An unreachable server
//! fails the test: it is never skipped.

#![allow(dead_code)]

use keiro_store::{Store, StoreOptions};
use sqlx::{Connection, PgConnection};
use tempfile::TempDir;

/// The variable naming the PostgreSQL server the tests use.
pub(crate) const POSTGRES_URL_VAR: &str = "KEIRO_TEST_POSTGRES_URL";

const DEFAULT_POSTGRES_URL: &str = "postgres:///keiro_test";

/// The PostgreSQL URL the tests start from.
pub(crate) fn postgres_url() -> String {
    std::env::var(POSTGRES_URL_VAR).unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned())
}

/// Returns `url` with its database replaced by `database`, keeping the scheme,
/// credentials, host, port and query parameters (a `dbname` parameter, which
/// would override the path, is dropped).
///
/// ```text
/// postgres:///keiro_test              -> postgres:///<database>
/// postgres://u:pw@h:5432/db?ssl=x     -> postgres://u:pw@h:5432/<database>?ssl=x
/// postgres://h                        -> postgres://h/<database>
/// ```
pub(crate) fn with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => (&url[..at + 3], &url[at + 3..]),
        None => panic!("{POSTGRES_URL_VAR}=`{url}` is not a postgres:// URL"),
    };
    let (before_query, query) = match rest.find('?') {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let authority = match before_query.find('/') {
        Some(at) => &before_query[..at],
        None => before_query,
    };
    let mut out = format!("{scheme}{authority}/{database}");
    let params: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty() && !p.starts_with("dbname="))
        .collect();
    if !params.is_empty() {
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// Creates a fresh, empty PostgreSQL database and returns its name and URL.
///
/// Panics (failing the test) with a message naming `KEIRO_TEST_POSTGRES_URL`
/// when the server cannot be reached or refuses.
pub(crate) async fn create_postgres_database() -> (String, String) {
    let admin_url = postgres_url();
    let name = format!("keiro_t_{}", uuid::Uuid::new_v4().simple());
    let mut admin = admin_connection(&admin_url).await;
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot create test database `{name}` through {POSTGRES_URL_VAR}=`{}`: {e}",
                redact(&admin_url)
            )
        });
    let _ = admin.close().await;
    let url = with_database(&admin_url, &name);
    (name, url)
}

/// Drops a database made by [`create_postgres_database`], disconnecting any
/// session still on it.
pub(crate) async fn drop_postgres_database(name: &str) {
    let admin_url = postgres_url();
    let mut admin = admin_connection(&admin_url).await;
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("cannot drop test database `{name}`: {e}"));
    let _ = admin.close().await;
}

async fn admin_connection(admin_url: &str) -> PgConnection {
    PgConnection::connect(admin_url).await.unwrap_or_else(|e| {
        panic!(
            "the PostgreSQL tests need a server: set {POSTGRES_URL_VAR} (now `{}`) to a \
             database a role with CREATEDB can connect to (e.g. run .ci/test.sh, or \
             `pg_ctlcluster 15 main start`): {e}",
            redact(admin_url)
        )
    })
}

fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_owned(),
    }
}

/// Which backend a [`TestDb`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// A connected store on a database of its own.
pub(crate) struct TestDb {
    pub(crate) backend: Backend,
    pub(crate) url: String,
    pub(crate) store: Store,
    postgres_database: Option<String>,
    _dir: Option<TempDir>,
}

/// The options test stores use: a small pool, so many tests can run side by
/// side on one PostgreSQL server.
pub(crate) fn test_options() -> StoreOptions {
    StoreOptions {
        max_connections: Some(4),
        ..StoreOptions::default()
    }
}

impl TestDb {
    /// A store on a fresh SQLite file in a temporary directory.
    pub(crate) async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("keiro.db").display());
        let store = Store::connect(&url, &test_options())
            .await
            .unwrap_or_else(|e| panic!("connect to `{url}`: {e}"));
        TestDb {
            backend: Backend::Sqlite,
            url,
            store,
            postgres_database: None,
            _dir: Some(dir),
        }
    }

    /// A store on a fresh PostgreSQL database.
    pub(crate) async fn postgres() -> TestDb {
        let (name, url) = create_postgres_database().await;
        let store = Store::connect(&url, &test_options())
            .await
            .unwrap_or_else(|e| panic!("connect to fresh test database `{name}`: {e}"));
        TestDb {
            backend: Backend::Postgres,
            url,
            store,
            postgres_database: Some(name),
            _dir: None,
        }
    }

    /// Another store (its own pool) on the same database, as a second
    /// process would have.
    pub(crate) async fn second_store(&self) -> Store {
        Store::connect(&self.url, &test_options())
            .await
            .unwrap_or_else(|e| panic!("connect a second store to `{}`: {e}", self.url))
    }

    /// Runs one statement written for SQLite's `keiro_workflows` /
    /// `keiro_steps`; on PostgreSQL the table names become `keiro.workflows` /
    /// `keiro.steps` and `?N` placeholders become `$N`.
    pub(crate) async fn execute_raw(&self, sql: &str, binds: &[&str]) -> u64 {
        match &self.store {
            Store::Sqlite(s) => {
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = q.bind(*b);
                }
                q.execute(s.pool()).await.expect(sql).rows_affected()
            }
            Store::Postgres(p) => {
                let sql = sql
                    .replace("keiro_workflows", "keiro.workflows")
                    .replace("keiro_steps", "keiro.steps")
                    .replace('?', "$");
                let mut q = sqlx::query(&sql);
                for b in binds {
                    q = q.bind(*b);
                }
                q.execute(p.pool()).await.expect(&sql).rows_affected()
            }
        }
    }

    /// Closes the store and, on PostgreSQL, drops the database.
    pub(crate) async fn finish(self) {
        self.store.close().await;
        if let Some(name) = &self.postgres_database {
            drop_postgres_database(name).await;
        }
    }
}

#[test]
fn with_database_replaces_only_the_database() {
    assert_eq!(
        with_database("postgres:///keiro_test", "t1"),
        "postgres:///t1"
    );
    assert_eq!(
        with_database(
            "postgres://u:pw@db.example:5433/keiro?sslmode=disable",
            "t1"
        ),
        "postgres://u:pw@db.example:5433/t1?sslmode=disable"
    );
    assert_eq!(
        with_database(
            "postgresql://u@h/keiro?dbname=other&application_name=x",
            "t1"
        ),
        "postgresql://u@h/t1?application_name=x"
    );
    assert_eq!(with_database("postgres://h", "t1"), "postgres://h/t1");
    assert_eq!(
        with_database("postgres://h:5432?x=1", "t1"),
        "postgres://h:5432/t1?x=1"
    );
}

/// Runs each listed `async fn(&TestDb)` case as `sqlite::<case>` on a fresh
/// SQLite file and as `postgres::<case>` on a fresh PostgreSQL database.
#[allow(unused_macros)]
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let db = crate::support::TestDb::sqlite().await;
                    crate::$case(&db).await;
                    db.finish().await;
                }
            )*
        }

        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let db = crate::support::TestDb::postgres().await;
                    crate::$case(&db).await;
                    db.finish().await;
                }
            )*
        }
    };
}
