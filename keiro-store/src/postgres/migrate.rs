//! Running [`POSTGRES_MIGRATOR`](super::POSTGRES_MIGRATOR): with session
//! locks on a direct connection, or in one transaction through a
//! transaction-pooling proxy.

use std::collections::HashMap;
use std::time::Instant;

use sqlx::migrate::MigrateError;
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Executor};

use super::POSTGRES_MIGRATOR;

/// The advisory lock (`"keiro"` in ASCII) that serialises creating the
/// `keiro` schema across processes starting at the same time.
const SCHEMA_LOCK: i64 = 0x6b_6569_726f;

/// Bounds how long the migration's session may sit idle, in a transaction
/// or not (`idle_session_timeout` from PostgreSQL 14), before the server
/// ends it and releases its locks.
const IDLE_LIMITS: &str = "SELECT set_config('idle_in_transaction_session_timeout', '5s', false), \
     CASE WHEN current_setting('server_version_num')::int >= 140000 \
     THEN set_config('idle_session_timeout', '5s', false) END";

/// Creates the `keiro` schema and runs [`POSTGRES_MIGRATOR`] with sqlx's
/// bookkeeping table inside it, on a session of its own (a direct
/// connection, which is closed afterwards).
pub(super) async fn on_session(conn: &mut PgConnection) -> Result<(), MigrateError> {
    // `CREATE SCHEMA IF NOT EXISTS` is not safe against a concurrent creator
    // (it can fail on the catalog's unique index), hence the lock. Each
    // statement commits on its own, so the schema exists before the lock is
    // released. The changed search path is seen only by this short-lived
    // session, and so are its idle limits: the schema lock and sqlx's
    // migration lock are session locks, which a process that vanished
    // mid-migration (its connection blackholed, not closed) would otherwise
    // hold for as long as the server keeps the dead connection (hours),
    // stopping every other process's start. keiro sends this session's
    // statements back to back, so an idle one has lost its client.
    for statement in [
        IDLE_LIMITS.to_owned(),
        format!("SELECT pg_advisory_lock({SCHEMA_LOCK})"),
        "CREATE SCHEMA IF NOT EXISTS keiro".to_owned(),
        format!("SELECT pg_advisory_unlock({SCHEMA_LOCK})"),
        "SET search_path TO keiro".to_owned(),
    ] {
        conn.execute(statement.as_str()).await?;
    }
    POSTGRES_MIGRATOR.run_direct(conn).await
}

/// Does what [`on_session`] does in one transaction that leaves nothing
/// behind in the session: a transaction lock instead of session locks,
/// `SET LOCAL`, simple-protocol migration scripts and unnamed statements.
/// The bookkeeping is sqlx's own table, checked as sqlx checks it, so a
/// database migrated either way is up to date for the other.
pub(super) async fn in_transaction(conn: &mut PgConnection) -> Result<(), MigrateError> {
    let mut tx = conn.begin_with(super::BEGIN).await?;
    for statement in [
        format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"),
        "CREATE SCHEMA IF NOT EXISTS keiro".to_owned(),
        "SET LOCAL search_path TO keiro".to_owned(),
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations (version BIGINT PRIMARY KEY, description \
         TEXT NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT \
         NULL, checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)"
            .to_owned(),
    ] {
        tx.execute(statement.as_str()).await?;
    }
    let applied: Vec<(i64, Vec<u8>, bool)> = crate::prepared::query_as(
        "SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version",
    )
    .fetch_all(&mut *tx)
    .await?;
    if let Some((version, _, _)) = applied.iter().find(|(_, _, success)| !success) {
        return Err(MigrateError::Dirty(*version));
    }
    let known: HashMap<i64, &[u8]> = POSTGRES_MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| (m.version, m.checksum.as_ref()))
        .collect();
    let applied: HashMap<i64, Vec<u8>> = applied
        .into_iter()
        .map(|(version, checksum, _)| (version, checksum))
        .collect();
    for (version, checksum) in &applied {
        match known.get(version) {
            None => return Err(MigrateError::VersionMissing(*version)),
            Some(expected) if *expected != checksum.as_slice() => {
                return Err(MigrateError::VersionMismatch(*version))
            }
            _ => {}
        }
    }
    for migration in POSTGRES_MIGRATOR.iter() {
        if migration.migration_type.is_down_migration() || applied.contains_key(&migration.version)
        {
            continue;
        }
        let started = Instant::now();
        tx.execute(migration.sql.as_ref())
            .await
            .map_err(|e| MigrateError::ExecuteMigration(e, migration.version))?;
        crate::prepared::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
             execution_time) VALUES ($1, $2, TRUE, $3, $4)",
        )
        .bind(migration.version)
        .bind(migration.description.as_ref())
        .bind(migration.checksum.as_ref())
        .bind(i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
