//! The embedded SQLite backend: one file, WAL, one writer.
//!
//! Multi-statement writes run under `BEGIN IMMEDIATE`, which takes the write
//! lock up front, so their reads and writes are never interleaved with
//! another writer's.

mod gate;
pub(crate) mod journal;
#[cfg(test)]
mod plans;
mod resume;

use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sqlx::migrate::MigrateError;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous as Sync,
};
use sqlx::{Sqlite, Transaction};

use crate::error::{is_sqlite_busy, redact};
use crate::sql::{Dialect, Statements};
use crate::{Result, SqliteSynchronous, StoreError, StoreOptions};

/// The SQLite migrations, embedded at build time (made into a migrator on
/// first use).
pub static SQLITE_MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| crate::migrations::migrator(crate::migrations::SQLITE));

/// How SQLite spells the shared statements.
const DIALECT: Dialect = Dialect::plain(
    "keiro_",
    resume::registered_match,
    resume::registered_rows,
    resume::json_text_elements,
);

/// SQLite's text of the shared statements, built on first use.
pub(crate) static SQL: LazyLock<Statements> = LazyLock::new(|| Statements::new(&DIALECT));

/// Runs [`SQLITE_MIGRATOR`] on `pool`, safe under concurrent first opens.
///
/// sqlx takes no lock around SQLite migrations: two processes opening a fresh
/// file both see migration N unapplied, and the one that gets the write lock
/// second fails on `table ... already exists`, although the other applied N
/// (each migration commits with its `_sqlx_migrations` row). So when a run
/// fails and meanwhile more migrations were recorded as applied than before
/// the run (another opener made progress), or the error is BUSY/LOCKED, run
/// the migrator again after a short jittered wait: it then skips what the
/// other applied. Bounded; a failure nobody else explains is reported as is.
async fn migrate(pool: &SqlitePool) -> Result<()> {
    let mut attempt = 0;
    loop {
        let before = applied_migrations(pool).await;
        let error = match SQLITE_MIGRATOR.run(pool).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let busy = matches!(
            &error,
            MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) if is_sqlite_busy(e)
        );
        if attempt < 50 && (busy || applied_migrations(pool).await > before) {
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(20 + jitter() % 80)).await;
            continue;
        }
        return Err(StoreError::Migrate {
            backend: "sqlite",
            source: Arc::new(error),
        });
    }
}

/// How many migrations `pool`'s database records as applied (0 before the
/// bookkeeping table exists).
async fn applied_migrations(pool: &SqlitePool) -> i64 {
    crate::prepared::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// A random number, so that racing openers do not retry in lockstep.
fn jitter() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// Fails with [`StoreError::ReadOnly`] when the database cannot be written.
///
/// SQLite opens a file it may not write (permissions, `mode=ro`) read-only
/// without complaint, and a migrated schema needs no write, so without this
/// probe the first journal write would fail much later, far from the cause.
/// The probe rewrites the header's `user_version` with its own value.
async fn refuse_read_only(pool: &SqlitePool, url: &str) -> Result<()> {
    let probe = async {
        let mut conn = pool.acquire().await?;
        let version: i64 = crate::prepared::query_scalar("PRAGMA user_version")
            .fetch_one(&mut *conn)
            .await?;
        crate::prepared::query(&format!("PRAGMA user_version = {version}"))
            .execute(&mut *conn)
            .await?;
        Ok::<(), sqlx::Error>(())
    };
    match probe.await {
        Ok(()) => Ok(()),
        Err(sqlx::Error::Database(db)) if is_read_only_code(db.code().as_deref()) => {
            Err(StoreError::ReadOnly {
                url: redact(url),
                reason: db.message().to_string(),
            })
        }
        Err(e) => Err(StoreError::Connect {
            url: redact(url),
            source: Arc::new(e),
        }),
    }
}

/// Whether a SQLite result code is `SQLITE_READONLY` (8) or one of its
/// extended codes, which share the low byte (e.g. 1032, `READONLY_DBMOVED`).
fn is_read_only_code(code: Option<&str>) -> bool {
    code.and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 8)
}

/// Keeps a connection for the pool only when it is outside any transaction.
///
/// When SQLite fails a `COMMIT` (disk full, I/O error) it may roll the
/// transaction back itself; sqlx still counts it as open, its rollback on
/// drop then fails ("no transaction is active"), and every later `BEGIN` on
/// that connection fails with "non-zero transaction depth": the process
/// would never write again. A committed connection is kept at no cost; for
/// one that looks inside a transaction, a round trip first lets the rollback
/// queued by the dropped transaction run, and a connection still inside one
/// after it is closed, so the pool opens a fresh one.
async fn release_outside_transaction(
    conn: &mut sqlx::SqliteConnection,
) -> std::result::Result<bool, sqlx::Error> {
    use sqlx::Connection;
    if !conn.is_in_transaction() {
        return Ok(true);
    }
    conn.ping().await?;
    if conn.is_in_transaction() {
        tracing::warn!("discarding a SQLite connection left inside a failed transaction");
        return Ok(false);
    }
    Ok(true)
}

/// The SQLite journal store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Queues this process's writers of the file (see [`gate`]).
    gate: gate::WriteGate,
    /// Where this store's "now" comes from.
    pub(crate) clock: crate::Clock,
    /// The empty transaction the last transactional step left for the next
    /// (see [`crate::warm`]); `None` on a pool of one connection.
    warm: Option<Arc<crate::warm::WarmTx<Sqlite>>>,
}

impl SqliteStore {
    /// Opens (creating if missing) the SQLite database at `url` in WAL mode and
    /// migrates it; with [`StoreOptions::migrate`] `false` it creates and
    /// migrates nothing.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<SqliteStore> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            })?
            .create_if_missing(options.migrate)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.sqlite_synchronous {
                SqliteSynchronous::Full => Sync::Full,
                SqliteSynchronous::Normal => Sync::Normal,
            })
            .busy_timeout(Duration::from_secs(30));
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        // An in-memory database lives in one connection; a file serves
        // concurrent readers beside its single writer.
        let connections = if in_memory {
            1
        } else {
            options.max_connections.unwrap_or(4)
        };
        let pool_options = SqlitePoolOptions::new()
            .max_connections(connections)
            .min_connections(1)
            // An embedded connection does not go stale: no ping (a hop to
            // its thread) before each checkout.
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            // The table of a transactional step's mark (see `step_tx`).
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::Executor::execute(&mut *conn, crate::step_tx::MARK_TABLE)
                        .await
                        .map(drop)
                })
            })
            .after_release(|conn, _| Box::pin(release_outside_transaction(conn)));
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
        if options.migrate {
            migrate(&pool).await?;
        }
        refuse_read_only(&pool, url).await?;
        Ok(SqliteStore {
            pool,
            gate: gate::WriteGate::of((!in_memory).then(|| connect.get_filename().to_path_buf())),
            clock: options.clock.clone(),
            warm: (connections > 1).then(Arc::default),
        })
    }

    /// The underlying pool, for tests and benchmarks.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The pool as the executor of one statement that commits alone (the
    /// PostgreSQL store's counterpart may wrap it in a transaction).
    pub(crate) fn exec(&self) -> &SqlitePool {
        &self.pool
    }

    /// Begins a write transaction for operation `op`, taking this process's
    /// write turn (see [`gate`]) and then SQLite's write lock.
    pub(crate) async fn begin(&self, op: &'static str) -> Result<gate::GatedTx> {
        let turn = self.gate.enter().await;
        let tx = self.begin_ungated("BEGIN IMMEDIATE", op).await?;
        Ok(gate::GatedTx::new(tx, turn))
    }

    /// This process's turn to write the file, for a lone write statement
    /// (see [`gate`]): held until dropped.
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.gate.enter().await
    }

    /// Begins a transaction with `statement` (which begins it, and may run
    /// more in the same call) without the write turn: a transactional
    /// step's, whose body is the application's code.
    pub(crate) async fn begin_ungated(
        &self,
        statement: &'static str,
        op: &'static str,
    ) -> Result<Transaction<'static, Sqlite>> {
        self.pool
            .begin_with(statement)
            .await
            .map_err(StoreError::query(op))
    }

    /// The empty transaction the last transactional step left open (see
    /// [`crate::warm`]), if one is kept.
    pub(crate) fn take_warm(&self) -> Option<Transaction<'static, Sqlite>> {
        self.warm.as_ref().and_then(|warm| warm.take(&self.pool))
    }

    /// Keeps `tx`, open and empty (a deferred `BEGIN` that has run nothing)
    /// after a transactional step's commit, for the next one; without a
    /// [`crate::warm`] slot it is rolled back.
    pub(crate) fn keep_warm(&self, tx: Transaction<'static, Sqlite>) {
        if let Some(warm) = &self.warm {
            warm.keep(&self.pool, tx);
        }
    }

    /// Closes the pool, returning a kept transaction first.
    pub(crate) async fn close(&self) {
        drop(self.take_warm());
        self.pool.close().await;
    }

    /// [`SqliteStore::begin`] for a transaction of the writer's batch
    /// statements: the same (SQLite has no plan cache to steer), so both
    /// backends spell a batch transaction alike.
    pub(crate) async fn begin_batch(&self, op: &'static str) -> Result<gate::GatedTx> {
        self.begin(op).await
    }

    /// A pooled connection for operation `op`.
    pub(crate) async fn acquire(&self, op: &'static str) -> Result<PoolConnection<Sqlite>> {
        self.pool.acquire().await.map_err(StoreError::query(op))
    }
}
