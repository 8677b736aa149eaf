//! PostgreSQL queries of the resume worker: discovery, crash accounting and
//! executor identities.

use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::types::parse_status;
use crate::{
    now_ms, BlockReason, Blocked, Crash, ExecutorRow, InstanceStatus, PostgresStore, Registered,
    Result, StoreError,
};

/// The notification channel resume workers listen on.
const WAKE_CHANNEL: &str = "keiro_wake";

impl PostgresStore {
    /// A listener on the `keiro_wake` channel, on which enqueues and other
    /// wake sources notify resume workers.
    pub async fn listen_wakes(&self) -> Result<sqlx::postgres::PgListener> {
        let mut listener = sqlx::postgres::PgListener::connect_with(self.pool())
            .await
            .map_err(StoreError::query("listen_wakes"))?;
        listener
            .listen(WAKE_CHANNEL)
            .await
            .map_err(StoreError::query("listen_wakes"))?;
        Ok(listener)
    }

    pub(crate) async fn wake_workers(&self, id: &str) -> Result<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WAKE_CHANNEL)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(StoreError::query("wake_workers"))?;
        Ok(())
    }

    pub(crate) async fn find_blocked(
        &self,
        owner: &str,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<Blocked>> {
        let now = now_ms();
        let (names, signatures) = crate::postgres::split(workflows);
        let rows = sqlx::query(
            "SELECT w.id, w.name, w.signature, r.signature AS registered \
             FROM keiro.workflows w \
             LEFT JOIN UNNEST($3::text[], $5::text[]) AS r(name, signature) ON r.name = w.name \
             WHERE w.status IN ('pending', 'running', 'suspended') AND w.wake_at <= $2 \
             AND (r.name IS NULL OR w.signature <> r.signature \
                  OR (w.lease_owner IS NOT NULL AND w.lease_owner <> $1 \
                      AND w.lease_expires_at >= $2)) \
             ORDER BY w.wake_at LIMIT $4",
        )
        .bind(owner)
        .bind(now)
        .bind(names)
        .bind(limit)
        .bind(signatures)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("find_blocked"))?;
        rows.iter()
            .map(|row| {
                Ok(Blocked {
                    id: row.try_get("id").map_err(unreadable)?,
                    name: row.try_get("name").map_err(unreadable)?,
                    reason: BlockReason::of(
                        row.try_get("signature").map_err(unreadable)?,
                        row.try_get("registered").map_err(unreadable)?,
                    ),
                })
            })
            .collect()
    }

    pub(crate) async fn reclaim_own(&self, owner: &str) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE keiro.workflows SET wake_at = $2 WHERE lease_owner = $1 \
             AND status IN ('pending', 'running', 'suspended')",
        )
        .bind(owner)
        .bind(now_ms())
        .execute(self.pool())
        .await
        .map_err(StoreError::query("reclaim_own"))?;
        Ok(done.rows_affected())
    }

    pub(crate) async fn record_crash(
        &self,
        crash: &Crash<'_>,
    ) -> Result<Option<(InstanceStatus, i64)>> {
        let now = now_ms();
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("record_crash"))?;
        let row = sqlx::query(
            "UPDATE keiro.workflows SET attempts = attempts + 1, error = $3, \
             status = CASE WHEN attempts + 1 >= $4 THEN 'failed' ELSE status END, \
             wake_at = CASE WHEN attempts + 1 >= $4 THEN NULL ELSE $5 END, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = $6 \
             WHERE id = $1 AND lease_owner = $2 AND status IN ('pending', 'running', 'suspended') \
             RETURNING status, attempts",
        )
        .bind(crash.id)
        .bind(crash.owner)
        .bind(crash.error)
        .bind(crash.max_attempts)
        .bind(crash.retry_at)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query("record_crash"))?;
        let outcome = match row {
            None => None,
            Some(row) => {
                let status: String = row.try_get("status").map_err(unreadable)?;
                let attempts: i64 = row.try_get("attempts").map_err(unreadable)?;
                Some((parse_status(crash.id, &status)?, attempts))
            }
        };
        if let Some((InstanceStatus::Failed, _)) = outcome {
            crate::postgres::report_to_parent(&mut tx, crash.id, now).await?;
        }
        tx.commit()
            .await
            .map_err(StoreError::query("record_crash"))?;
        Ok(outcome)
    }

    pub(crate) async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRow>> {
        let row = sqlx::query(
            "SELECT id, token, host, pid, heartbeat_at FROM keiro.executors WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("get_executor"))?;
        row.as_ref().map(executor_from_row).transpose()
    }

    pub(crate) async fn list_executors(&self, base: &str) -> Result<Vec<ExecutorRow>> {
        let rows = sqlx::query(
            "SELECT id, token, host, pid, heartbeat_at FROM keiro.executors \
             WHERE id = $1 OR substr(id, 1, length($2)) = $2 ORDER BY id",
        )
        .bind(base)
        .bind(format!("{base}#"))
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("list_executors"))?;
        rows.iter().map(executor_from_row).collect()
    }

    pub(crate) async fn put_executor(
        &self,
        executor: &ExecutorRow,
        replacing: Option<&str>,
    ) -> Result<bool> {
        let query = match replacing {
            None => sqlx::query(
                "INSERT INTO keiro.executors (id, token, host, pid, heartbeat_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
            ),
            Some(_) => sqlx::query(
                "UPDATE keiro.executors SET token = $2, host = $3, pid = $4, heartbeat_at = $5 \
                 WHERE id = $1 AND token = $6",
            ),
        };
        let query = query
            .bind(&executor.id)
            .bind(&executor.token)
            .bind(&executor.host)
            .bind(executor.pid)
            .bind(executor.heartbeat_at);
        let query = match replacing {
            None => query,
            Some(old) => query.bind(old),
        };
        let done = query
            .execute(self.pool())
            .await
            .map_err(StoreError::query("put_executor"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn heartbeat_executor(&self, id: &str, token: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE keiro.executors SET heartbeat_at = $3 WHERE id = $1 AND token = $2",
        )
        .bind(id)
        .bind(token)
        .bind(now_ms())
        .execute(self.pool())
        .await
        .map_err(StoreError::query("heartbeat_executor"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn remove_executor(&self, id: &str, token: &str) -> Result<Option<u64>> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("remove_executor"))?;
        let removed = sqlx::query("DELETE FROM keiro.executors WHERE id = $1 AND token = $2")
            .bind(id)
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("remove_executor"))?;
        if removed.rows_affected() == 0 {
            return Ok(None);
        }
        sqlx::query("DELETE FROM keiro.worker_workflows WHERE executor_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("remove_executor"))?;
        // In the same transaction: a process inserting the identity anew
        // waits on the deleted row until these leases are released.
        let released = sqlx::query(
            "UPDATE keiro.workflows SET lease_owner = NULL, lease_expires_at = NULL, \
             wake_at = $2, updated_at = $2 \
             WHERE lease_owner = $1 AND status IN ('pending', 'running', 'suspended')",
        )
        .bind(id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("remove_executor"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("remove_executor"))?;
        Ok(Some(released.rows_affected()))
    }
}

fn executor_from_row(row: &PgRow) -> Result<ExecutorRow> {
    Ok(ExecutorRow {
        id: row.try_get("id").map_err(unreadable)?,
        token: row.try_get("token").map_err(unreadable)?,
        host: row.try_get("host").map_err(unreadable)?,
        pid: row.try_get("pid").map_err(unreadable)?,
        heartbeat_at: row.try_get("heartbeat_at").map_err(unreadable)?,
    })
}

fn unreadable(e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        what: format!("a column could not be read: {e}"),
    }
}
