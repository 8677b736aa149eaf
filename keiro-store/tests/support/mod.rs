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
use keiro_test_support::{
    redact_url, PgBouncer, PostgresServer, TEST_DATABASE_PREFIX, TEST_POSTGRES_URL_VAR,
};
use tempfile::TempDir;

/// The server the tests create their databases on.
fn postgres_server() -> PostgresServer {
    PostgresServer::from_env(TEST_POSTGRES_URL_VAR)
}

/// Creates a fresh, empty `keiro_t_<uuid>` PostgreSQL database and returns
/// its name and URL.
///
/// Panics (failing the test) with a message naming `KEIRO_TEST_POSTGRES_URL`
/// when the server cannot be reached or refuses.
pub(crate) async fn create_postgres_database() -> (String, String) {
    let fresh = postgres_server()
        .create_database(TEST_DATABASE_PREFIX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (fresh.name, fresh.url)
}

/// Drops a database made by [`create_postgres_database`], disconnecting any
/// session still on it.
pub(crate) async fn drop_postgres_database(name: &str) {
    postgres_server()
        .drop_database(name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
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
    /// The options `store` was opened with (a second store gets the same).
    pub(crate) options: StoreOptions,
    /// Through pgbouncer: a direct pool on the same database, for the
    /// tests' own statements (see [`TestDb::pg_pool`]).
    direct: Option<sqlx::PgPool>,
    /// The database's URL without pgbouncer (`url` itself when direct).
    direct_url: String,
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
        TestDb::connect(Backend::Sqlite, url, test_options(), None, Some(dir)).await
    }

    /// A store on a fresh PostgreSQL database.
    pub(crate) async fn postgres() -> TestDb {
        let (name, url) = create_postgres_database().await;
        TestDb::connect(Backend::Postgres, url, test_options(), Some(name), None).await
    }

    /// A store on a fresh PostgreSQL database reached through this test
    /// process's pgbouncer in transaction pooling mode
    /// (`pooler=transaction`), with the direct URL as `listen_url`.
    pub(crate) async fn pgbouncer() -> TestDb {
        let (name, direct_url) = create_postgres_database().await;
        let url = PgBouncer::shared(&postgres_server()).url(&name);
        let options = StoreOptions {
            listen_url: Some(direct_url.clone()),
            ..test_options()
        };
        let mut db = TestDb::connect(Backend::Postgres, url, options, Some(name), None).await;
        let direct = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&direct_url)
            .await
            .expect("connect directly to the test database");
        db.direct = Some(direct);
        db.direct_url = direct_url;
        db
    }

    /// The database's URL, bypassing pgbouncer.
    pub(crate) fn direct_url(&self) -> &str {
        &self.direct_url
    }

    /// Whether the store is reached through pgbouncer.
    pub(crate) fn via_pooler(&self) -> bool {
        self.direct.is_some()
    }

    /// The PostgreSQL pool for statements a test runs itself: the store's,
    /// or a direct one when the store is behind pgbouncer (the tests' own
    /// statements are prepared by name and may commit alone).
    pub(crate) fn pg_pool(&self) -> &sqlx::PgPool {
        match (&self.direct, &self.store) {
            (Some(direct), _) => direct,
            (None, Store::Postgres(pg)) => pg.pool(),
            (None, _) => panic!("expected the PostgreSQL backend"),
        }
    }

    async fn connect(
        backend: Backend,
        url: String,
        options: StoreOptions,
        postgres_database: Option<String>,
        dir: Option<TempDir>,
    ) -> TestDb {
        let store = Store::connect(&url, &options).await.unwrap_or_else(|e| {
            panic!("connect to fresh test database `{}`: {e}", redact_url(&url))
        });
        TestDb {
            backend,
            direct_url: url.clone(),
            url,
            store,
            options,
            direct: None,
            postgres_database,
            _dir: dir,
        }
    }

    /// Another store (its own pool) on the same database, as a second
    /// process would have.
    pub(crate) async fn second_store(&self) -> Store {
        Store::connect(&self.url, &self.options)
            .await
            .unwrap_or_else(|e| {
                panic!("connect a second store to `{}`: {e}", redact_url(&self.url))
            })
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
                let _ = p;
                q.execute(self.pg_pool()).await.expect(&sql).rows_affected()
            }
        }
    }

    /// Closes the store and, on PostgreSQL, drops the database.
    pub(crate) async fn finish(self) {
        self.store.close().await;
        if let Some(direct) = &self.direct {
            direct.close().await;
        }
        if let Some(name) = &self.postgres_database {
            drop_postgres_database(name).await;
        }
    }
}

/// Runs each listed `async fn(&TestDb)` case as `sqlite::<case>` on a fresh
/// SQLite file, as `postgres::<case>` on a fresh PostgreSQL database, and as
/// `pgbouncer::<case>` on one reached through pgbouncer in transaction
/// pooling mode.
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

        mod pgbouncer {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let db = crate::support::TestDb::pgbouncer().await;
                    crate::$case(&db).await;
                    db.finish().await;
                }
            )*
        }
    };
}

/// The executor the shared fixtures lease instances to.
pub(crate) const OWNER: &str = "w1";

/// A minute's lease for [`OWNER`].
pub(crate) fn lease() -> keiro_store::Lease<'static> {
    keiro_store::Lease {
        owner: OWNER,
        ttl_us: 60_000_000,
    }
}

/// Queue `name`'s limits when it has none.
pub(crate) fn no_limits(name: &str) -> keiro_store::QueueLimits<'_> {
    keiro_store::QueueLimits {
        name,
        concurrency: None,
        worker_concurrency: None,
        rate_limit: None,
    }
}

/// A completed end of generation 0 of `id` (output `1`) under [`OWNER`]'s
/// lease.
pub(crate) fn completed(id: &str) -> keiro_store::Finish<'_> {
    keiro_store::Finish {
        id,
        generation: 0,
        owner: OWNER,
        status: keiro_store::InstanceStatus::Completed,
        output: Some("1"),
        error: None,
    }
}

/// A new pending instance `id` of workflow `name`, with no arguments and
/// nothing else recorded.
pub(crate) fn pending<'a>(id: &'a str, name: &'a str) -> keiro_store::NewInstance<'a> {
    keiro_store::NewInstance::new(id, name, "[]")
}

/// Creates instance `id` of workflow `flow` leased to [`OWNER`] (a child of
/// `parent` at step 0, with `deadline`), asserting it is new; returns its
/// stored deadline (-1: none).
pub(crate) async fn create_flow(
    db: &TestDb,
    id: &str,
    parent: Option<&str>,
    deadline: Option<i64>,
) -> i64 {
    let new = keiro_store::NewInstance {
        id,
        name: "flow",
        input: "[]",
        signature: None,
        parent: parent.map(|parent| keiro_store::ParentLink {
            id: parent,
            generation: 0,
            seq: 0,
        }),
        lease: Some(lease()),
        deadline,
        traceparent: None,
        app_version: None,
        skeleton_hash: None,
    };
    let (row, created) = db.store.create_instance(&new).await.unwrap();
    assert!(created);
    row.deadline.unwrap_or(-1)
}
