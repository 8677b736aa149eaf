//! The embedded SQLite backend: one file, WAL, one writer.
//!
//! Multi-statement writes run under `BEGIN IMMEDIATE`, which takes the write
//! lock up front, so their reads and writes are never interleaved with
//! another writer's.

mod journal;
mod resume;

use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous as Sync,
};
use sqlx::{Sqlite, Transaction};

use crate::error::{is_sqlite_busy, redact};
use crate::sql::{Dialect, Statements};
use crate::{Result, SqliteSynchronous, StoreError, StoreOptions};

/// The SQLite migrations, embedded at build time.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// How SQLite spells the shared statements.
const DIALECT: Dialect =
    Dialect::plain("keiro_", resume::REGISTERED_MATCH, resume::registered_rows);

/// SQLite's text of the shared statements, built on first use.
pub(crate) static SQL: LazyLock<Statements> = LazyLock::new(|| Statements::new(&DIALECT));

/// The SQLite journal store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the SQLite database at `url` in WAL mode and
    /// migrates it.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<SqliteStore> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.sqlite_synchronous {
                SqliteSynchronous::Full => Sync::Full,
                SqliteSynchronous::Normal => Sync::Normal,
            })
            .busy_timeout(Duration::from_secs(30));
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let pool_options = SqlitePoolOptions::new()
            // An in-memory database lives in one connection; a file serves
            // concurrent readers beside its single writer.
            .max_connections(if in_memory {
                1
            } else {
                options.max_connections.unwrap_or(4)
            })
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None);
        // Opening sets pragmas that can meet another process's write lock
        // before the busy timeout applies: retry that briefly.
        let mut attempt = 0;
        let pool = loop {
            match pool_options.clone().connect_with(connect.clone()).await {
                Ok(pool) => break pool,
                Err(e) if attempt < 50 && is_sqlite_busy(&e) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => {
                    return Err(StoreError::Connect {
                        url: redact(url),
                        source: Arc::new(e),
                    })
                }
            }
        };
        SQLITE_MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Migrate {
                backend: "sqlite",
                source: Arc::new(e),
            })?;
        Ok(SqliteStore { pool })
    }

    /// The underlying pool, for tests and benchmarks.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Begins a write transaction for operation `op`, taking the write lock.
    pub(crate) async fn begin(&self, op: &'static str) -> Result<Transaction<'static, Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query(op))
    }

    /// A pooled connection for operation `op`.
    pub(crate) async fn acquire(&self, op: &'static str) -> Result<PoolConnection<Sqlite>> {
        self.pool.acquire().await.map_err(StoreError::query(op))
    }
}
