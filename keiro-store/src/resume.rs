//! What the resume worker asks of the store: discovery, claims, crash
//! accounting, executor identities and the workflow names each worker serves.
//!
//! Written once; `sqlite/resume.rs` and `postgres/resume.rs` hold the claims
//! and lookups that pass a worker's registered workflows (`json_each` on
//! SQLite, arrays on PostgreSQL).

use crate::journal::report_to_parent;
use crate::query::Statement;
use crate::rows::StoreRow;
use crate::versions::versions_json;
use crate::{
    now_us, rows, Blocked, Crash, ExecutorRow, InstanceRow, InstanceStatus, Lease, Registered,
    Result, Store, StoreError,
};

impl Store {
    /// Unfinished instances that are due now (pending, crashed with a lapsed
    /// lease, or suspended past their wake time), earliest first.
    pub async fn find_due(&self, limit: i64) -> Result<Vec<InstanceRow>> {
        let args = args![self.now_us(), limit];
        self.fetch_all("find_due", |sql| &sql.find_due, &args, None)
            .await
    }

    /// The earliest wake time of any unfinished instance, due or not (a
    /// suspended one's is the earlier of its wake time and its deadline):
    /// what a manual clock is moved to next.
    pub async fn next_wake_at(&self) -> Result<Option<i64>> {
        dispatch!(Store, self, |s, sql| crate::prepared::query_scalar(
            &sql.next_wake_at
        )
        .fetch_one(s.exec())
        .await)
        .map_err(StoreError::query("next_wake_at"))
    }

    /// Claims up to `limit` due instances of the `workflows` for
    /// `lease.owner` in one statement, earliest first (on PostgreSQL with
    /// `SKIP LOCKED`, so concurrent workers take disjoint batches). An
    /// instance is taken only when its name is registered with the same
    /// signature, or it has none recorded, and when its application version
    /// is one of `versions` or it has none (unversioned).
    pub async fn claim_due(
        &self,
        lease: Lease<'_>,
        workflows: &[Registered<'_>],
        versions: &[&str],
        limit: i64,
    ) -> Result<Vec<InstanceRow>> {
        let now = self.now_us();
        let versions = versions_json(versions);
        let args = args![lease.owner, now + lease.ttl_us, now, limit, &versions];
        let registered = Some(workflows);
        let claimed: Vec<rows::Claimed> = self
            .fetch_all("claim_due", |sql| &sql.claim_due, &args, registered)
            .await?;
        Ok(claimed.into_iter().map(|rows::Claimed(row)| row).collect())
    }

    /// Due instances `owner` cannot claim: of names not in `workflows`, of a
    /// name registered there with another signature, of an application
    /// version not in `versions`, or under another executor's live lease.
    pub async fn find_blocked(
        &self,
        owner: &str,
        workflows: &[Registered<'_>],
        versions: &[&str],
        limit: i64,
    ) -> Result<Vec<Blocked>> {
        let versions = versions_json(versions);
        let args = args![owner, self.now_us(), limit, &versions];
        let registered = Some(workflows);
        self.fetch_all("find_blocked", |sql| &sql.find_blocked, &args, registered)
            .await
    }

    /// Makes every unfinished instance leased by `owner` due now, so a process
    /// restarting under a dead predecessor's identity resumes its work at once.
    pub async fn reclaim_own(&self, owner: &str) -> Result<u64> {
        let args = args![owner, self.now_us()];
        self.execute("reclaim_own", |sql| &sql.reclaim_own, &args)
            .await
    }

    /// Counts a crash against an instance `crash.owner` holds and releases it:
    /// due again at `crash.retry_at`, or `failed` at `crash.max_attempts`.
    /// Returns the new status and attempt count, or `None` if the lease was lost.
    pub async fn record_crash(&self, crash: &Crash<'_>) -> Result<Option<(InstanceStatus, i64)>> {
        const OP: &str = "record_crash";
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let args = args![
                crash.id,
                crash.owner,
                crash.error,
                crash.max_attempts,
                crash.retry_at,
                now,
            ];
            let row = bind_all!(crate::prepared::query(&sql.record_crash), &args)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let outcome = match row {
                None => None,
                Some(row) => {
                    let what = || format!("workflow instance `{}`", crash.id);
                    let status = row.text(what, "status")?;
                    let attempts = row.int(what, "attempts")?;
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
        self.fetch_optional("get_executor", |sql| &sql.get_executor, &args![id])
            .await
    }

    /// Reads identity `base` and its numbered siblings `base#2`, `base#3`, …
    /// (the default identities of several processes of one program on one
    /// host), ordered by id.
    pub async fn list_executors(&self, base: &str) -> Result<Vec<ExecutorRow>> {
        let siblings = format!("{base}#");
        let args = args![base, &siblings];
        self.fetch_all("list_executors", |sql| &sql.list_executors, &args, None)
            .await
    }

    /// Registers an identity: inserts it when `replacing` is `None`, else takes
    /// it over from the process holding token `replacing`. Returns whether it
    /// applied (another process may have won the race).
    pub async fn put_executor(
        &self,
        executor: &ExecutorRow,
        replacing: Option<&str>,
    ) -> Result<bool> {
        let mut args = Vec::from(args![
            &executor.id,
            &executor.token,
            &executor.host,
            executor.pid,
            executor.heartbeat_at,
        ]);
        let statement: Statement = match replacing {
            None => |sql| &sql.insert_executor,
            Some(old) => {
                args.push(old.into());
                |sql| &sql.replace_executor
            }
        };
        Ok(self.execute("put_executor", statement, &args).await? == 1)
    }

    /// Refreshes a held identity's heartbeat; `false` when it was taken over.
    pub async fn heartbeat_executor(&self, id: &str, token: &str) -> Result<bool> {
        let args = args![id, token, now_us()];
        Ok(self
            .execute("heartbeat_executor", |sql| &sql.heartbeat_executor, &args)
            .await?
            == 1)
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
            let removed = crate::prepared::query(&sql.delete_executor)
                .bind(id)
                .bind(token)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            if removed.rows_affected() == 0 {
                return crate::query::rolled_back(tx, OP, None).await;
            }
            for delete in [&sql.delete_worker_workflows, &sql.delete_worker_queues] {
                crate::prepared::query(delete)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            }
            // In the same transaction, so no process can take the identity
            // (and its leases) between the two: on PostgreSQL one inserting
            // it anew waits on the deleted row.
            let released = crate::prepared::query(&sql.release_leases_of)
                .bind(id)
                .bind(self.now_us())
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Some(released.rows_affected()))
        })
    }

    /// Records that the resume worker of executor `executor_id` serves these
    /// workflow names and claims from these queues, each `(name, limits)`
    /// with its limits as text (replacing what it recorded before).
    pub async fn register_workflows(
        &self,
        executor_id: &str,
        names: &[&str],
        queues: &[(&str, &str)],
    ) -> Result<()> {
        const OP: &str = "register_workflows";
        // Passed as registered workflows (a queue's limits as the
        // signature), in the form each backend binds those.
        let workflows = unsigned(names);
        let queues: Vec<Registered<'_>> = queues
            .iter()
            .map(|&(name, signature)| Registered { name, signature })
            .collect();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let tables = [
                (
                    &sql.delete_worker_workflows,
                    &sql.insert_worker_workflows,
                    &workflows,
                ),
                (
                    &sql.delete_worker_queues,
                    &sql.insert_worker_queues,
                    &queues,
                ),
            ];
            for (delete, insert, rows) in tables {
                crate::prepared::query(delete)
                    .bind(executor_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
                let insert = crate::prepared::query(insert).bind(executor_id);
                s.bind_registered(insert, rows)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            }
            tx.commit().await.map_err(StoreError::query(OP))
        })
    }

    /// The queues executor `executor_id` registered that another executor
    /// whose heartbeat is at or after `alive_since` (µs since the Unix
    /// epoch) registered with other limits, by queue and executor.
    pub async fn queue_limits_elsewhere(
        &self,
        executor_id: &str,
        alive_since: i64,
    ) -> Result<Vec<OtherQueueLimits>> {
        const OP: &str = "queue_limits_elsewhere";
        dispatch!(Store, self, |s, sql| {
            let rows = crate::prepared::query(&sql.queue_limits_elsewhere)
                .bind(executor_id)
                .bind(alive_since)
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter()
                .map(|row| {
                    let what = || "a worker's queue".to_owned();
                    Ok(OtherQueueLimits {
                        queue: row.text(what, "queue")?,
                        executor_id: row.text(what, "executor_id")?,
                        limits: row.text(what, "limits")?,
                    })
                })
                .collect()
        })
    }

    /// Every named queue a live resume worker other than executor
    /// `executor_id` registered (its heartbeat at or after `alive_since`,
    /// µs since the Unix epoch), with each set of limits (as text)
    /// registered for it: what a process declaring no queue (the `keiro`
    /// command) knows of the queues' limits. A crashed worker's rows stay
    /// behind, but count no more once its heartbeat is old.
    pub async fn registered_queue_limits(
        &self,
        executor_id: &str,
        alive_since: i64,
    ) -> Result<Vec<(String, String)>> {
        const OP: &str = "registered_queue_limits";
        dispatch!(Store, self, |s, sql| {
            let rows = crate::prepared::query(&sql.registered_queue_limits)
                .bind(executor_id)
                .bind(alive_since)
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter()
                .map(|row| {
                    let what = || "a worker's queue".to_owned();
                    Ok((row.text(what, "queue")?, row.text(what, "limits")?))
                })
                .collect()
        })
    }

    /// The queue of instance `id` when no resume worker serving its
    /// workflow whose executor sent a heartbeat at or after `alive_since`
    /// (µs since the Unix epoch) claims from it; `None` when one does, or
    /// the instance is on the default queue (or gone). A worker that
    /// registered no queue at all (not even the default queue, `""`, which
    /// every worker since queues were registered declares) counts as
    /// claiming from every queue: it runs a version from before.
    pub async fn queue_unserved(&self, id: &str, alive_since: i64) -> Result<Option<String>> {
        dispatch!(Store, self, |s, sql| {
            let row = crate::prepared::query(&sql.queue_unserved)
                .bind(id)
                .bind(alive_since)
                .fetch_optional(s.exec())
                .await
                .map_err(StoreError::query("queue_unserved"))?;
            row.map(|row| row.text(|| format!("instance `{id}`"), "queue"))
                .transpose()
        })
    }

    /// Whether a worker whose executor sent a heartbeat at or after
    /// `alive_since` (µs since the Unix epoch) serves workflow `name`.
    pub async fn is_served(&self, name: &str, alive_since: i64) -> Result<bool> {
        dispatch!(Store, self, |s, sql| crate::prepared::query(&sql.is_served)
            .bind(name)
            .bind(alive_since)
            .fetch_one(s.exec())
            .await
            .map_err(StoreError::query("is_served"))
            .and_then(
                |row| row.flag(|| format!("workflow `{name}`"), "served")
            ))
    }
}

/// `names` in the form each backend binds registered workflows, without
/// signatures.
fn unsigned<'a>(names: &[&'a str]) -> Vec<Registered<'a>> {
    names
        .iter()
        .map(|&name| Registered {
            name,
            signature: "",
        })
        .collect()
}

/// A queue another live worker declares with other limits (see
/// [`Store::queue_limits_elsewhere`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherQueueLimits {
    /// The queue's name.
    pub queue: String,
    /// The other worker's executor id.
    pub executor_id: String,
    /// Its limits, as it registered them.
    pub limits: String,
}
