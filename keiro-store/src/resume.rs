//! What the resume worker asks of the store: discovery, claims, crash
//! accounting, executor identities and the workflow names each worker serves.
//!
//! Written once; `sqlite/resume.rs` and `postgres/resume.rs` hold the claims
//! and lookups that pass a worker's registered workflows (`json_each` on
//! SQLite, arrays on PostgreSQL).

use sqlx::Row;

use crate::journal::report_to_parent;
use crate::{
    now_ms, rows, Blocked, Crash, ExecutorRow, InstanceRow, InstanceStatus, Lease, Registered,
    Result, Store, StoreError,
};

impl Store {
    /// Unfinished instances that are due now (pending, crashed with a lapsed
    /// lease, or suspended past their wake time), earliest first.
    pub async fn find_due(&self, limit: i64) -> Result<Vec<InstanceRow>> {
        dispatch!(Store, self, |s, sql| {
            let rows = sqlx::query(&sql.find_due)
                .bind(now_ms())
                .bind(limit)
                .fetch_all(s.pool())
                .await
                .map_err(StoreError::query("find_due"))?;
            rows.iter().map(rows::instance).collect()
        })
    }

    /// Claims up to `limit` due instances of the `workflows` for
    /// `lease.owner` in one statement, earliest first (on PostgreSQL with
    /// `SKIP LOCKED`, so concurrent workers take disjoint batches). An
    /// instance is taken only when its name is registered with the same
    /// signature, or it has none recorded.
    pub async fn claim_due(
        &self,
        lease: Lease<'_>,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<InstanceRow>> {
        dispatch!(Store, self, |s| s.claim_due(lease, workflows, limit).await)
    }

    /// Due instances `owner` cannot claim: of names not in `workflows`, of a
    /// name registered there with another signature, or under another
    /// executor's live lease.
    pub async fn find_blocked(
        &self,
        owner: &str,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<Blocked>> {
        dispatch!(Store, self, |s| s
            .find_blocked(owner, workflows, limit)
            .await)
    }

    /// Makes every unfinished instance leased by `owner` due now, so a process
    /// restarting under a dead predecessor's identity resumes its work at once.
    pub async fn reclaim_own(&self, owner: &str) -> Result<u64> {
        dispatch!(Store, self, |s, sql| sqlx::query(&sql.reclaim_own)
            .bind(owner)
            .bind(now_ms())
            .execute(s.pool())
            .await
            .map(|done| done.rows_affected()))
        .map_err(StoreError::query("reclaim_own"))
    }

    /// Counts a crash against an instance `crash.owner` holds and releases it:
    /// due again at `crash.retry_at`, or `failed` at `crash.max_attempts`.
    /// Returns the new status and attempt count, or `None` if the lease was lost.
    pub async fn record_crash(&self, crash: &Crash<'_>) -> Result<Option<(InstanceStatus, i64)>> {
        const OP: &str = "record_crash";
        let now = now_ms();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let row = sqlx::query(&sql.record_crash)
                .bind(crash.id)
                .bind(crash.owner)
                .bind(crash.error)
                .bind(crash.max_attempts)
                .bind(crash.retry_at)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let outcome = match row {
                None => None,
                Some(row) => {
                    let what = || format!("workflow instance `{}`", crash.id);
                    let status: String = rows::StoreRow::read(&row, what, "status")?;
                    let attempts: i64 = rows::StoreRow::read(&row, what, "attempts")?;
                    Some((rows::instance_status(crash.id, &status)?, attempts))
                }
            };
            if let Some((InstanceStatus::Failed, _)) = outcome {
                report_to_parent((&mut *tx).into(), crash.id, now).await?;
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(outcome)
        })
    }

    /// Reads an executor identity's registration.
    pub async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRow>> {
        dispatch!(Store, self, |s, sql| {
            let row = sqlx::query(&sql.get_executor)
                .bind(id)
                .fetch_optional(s.pool())
                .await
                .map_err(StoreError::query("get_executor"))?;
            row.as_ref().map(rows::executor).transpose()
        })
    }

    /// Reads identity `base` and its numbered siblings `base#2`, `base#3`, …
    /// (the default identities of several processes of one program on one
    /// host), ordered by id.
    pub async fn list_executors(&self, base: &str) -> Result<Vec<ExecutorRow>> {
        let siblings = format!("{base}#");
        dispatch!(Store, self, |s, sql| {
            let rows = sqlx::query(&sql.list_executors)
                .bind(base)
                .bind(&siblings)
                .fetch_all(s.pool())
                .await
                .map_err(StoreError::query("list_executors"))?;
            rows.iter().map(rows::executor).collect()
        })
    }

    /// Registers an identity: inserts it when `replacing` is `None`, else takes
    /// it over from the process holding token `replacing`. Returns whether it
    /// applied (another process may have won the race).
    pub async fn put_executor(
        &self,
        executor: &ExecutorRow,
        replacing: Option<&str>,
    ) -> Result<bool> {
        let done = dispatch!(Store, self, |s, sql| {
            let statement = match replacing {
                None => &sql.insert_executor,
                Some(_) => &sql.replace_executor,
            };
            let query = sqlx::query(statement)
                .bind(&executor.id)
                .bind(&executor.token)
                .bind(&executor.host)
                .bind(executor.pid)
                .bind(executor.heartbeat_at);
            match replacing {
                None => query,
                Some(old) => query.bind(old),
            }
            .execute(s.pool())
            .await
            .map(|done| done.rows_affected())
        });
        Ok(done.map_err(StoreError::query("put_executor"))? == 1)
    }

    /// Refreshes a held identity's heartbeat; `false` when it was taken over.
    pub async fn heartbeat_executor(&self, id: &str, token: &str) -> Result<bool> {
        let done = dispatch!(Store, self, |s, sql| sqlx::query(&sql.heartbeat_executor)
            .bind(id)
            .bind(token)
            .bind(now_ms())
            .execute(s.pool())
            .await
            .map(|done| done.rows_affected()));
        Ok(done.map_err(StoreError::query("heartbeat_executor"))? == 1)
    }

    /// Gives up identity `id` held under `token` and, in the same
    /// transaction, releases every lease held under it: those unfinished
    /// instances keep their status and attempts and are due at once for any
    /// worker. Returns how many were released, or `None` (nothing changed)
    /// when `token` no longer holds the identity.
    pub async fn remove_executor(&self, id: &str, token: &str) -> Result<Option<u64>> {
        const OP: &str = "remove_executor";
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let removed = sqlx::query(&sql.delete_executor)
                .bind(id)
                .bind(token)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            if removed.rows_affected() == 0 {
                return Ok(None);
            }
            sqlx::query(&sql.delete_worker_workflows)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            // In the same transaction, so no process can take the identity
            // (and its leases) between the two: on PostgreSQL one inserting
            // it anew waits on the deleted row.
            let released = sqlx::query(&sql.release_leases_of)
                .bind(id)
                .bind(now_ms())
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Some(released.rows_affected()))
        })
    }

    /// Records that the resume worker of executor `executor_id` serves these
    /// workflow names (replacing what it recorded before).
    pub async fn register_workflows(&self, executor_id: &str, names: &[&str]) -> Result<()> {
        const OP: &str = "register_workflows";
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            sqlx::query(&sql.delete_worker_workflows)
                .bind(executor_id)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            s.insert_worker_workflows(&mut tx, executor_id, names)
                .await
                .map_err(StoreError::query(OP))?;
            tx.commit().await.map_err(StoreError::query(OP))
        })
    }

    /// Whether a worker whose executor sent a heartbeat at or after
    /// `alive_since` (ms since the Unix epoch) serves workflow `name`.
    pub async fn is_served(&self, name: &str, alive_since: i64) -> Result<bool> {
        dispatch!(Store, self, |s, sql| sqlx::query(&sql.is_served)
            .bind(name)
            .bind(alive_since)
            .fetch_one(s.pool())
            .await
            .and_then(|row| row.try_get::<bool, _>("served")))
        .map_err(StoreError::query("is_served"))
    }
}
