//! Repairing instances from outside: [`Store::retry`] puts a failed or
//! cancelled instance back in line with its journal, [`Store::fork`] starts a
//! new instance from a prefix of another's journal.

use crate::rows::{FromRow, StoreRow};
use crate::sql::{Dialect, STEP_COLUMNS};
use crate::validate::validate_id;
use crate::{rows, InstanceStatus, Result, StepRow, Store, StoreError};

/// The statements of [`Store::retry`] and [`Store::fork`].
#[derive(Debug)]
pub(crate) struct OperateStatements {
    /// The status and output of one instance, its row locked.
    status_for_retry: String,
    /// The name of an instance's parent when the parent's journal holds the
    /// instance's result already.
    parent_recorded: String,
    /// Puts one instance back to `pending`, due now, attempts reset.
    retry: String,
    /// The name and generation of the instance forked from, its row locked.
    fork_source: String,
    /// Inserts the fork's row from the source's (nothing on an id conflict).
    fork_instance: String,
    /// Copies the source's journal prefix under the fork's id.
    fork_steps: String,
    /// One generation's journal with how each entry ran.
    journal_entries: String,
}

impl OperateStatements {
    pub(crate) fn new(d: &Dialect) -> OperateStatements {
        let (w, s) = (
            format!("{}workflows", d.tables),
            format!("{}steps", d.tables),
        );
        OperateStatements {
            status_for_retry: format!("SELECT status, output FROM {w} WHERE id = $1{}", d.lock_row),
            parent_recorded: format!(
                "SELECT p.id, p.name FROM {w} c JOIN {w} p ON p.id = c.parent_id \
                 WHERE c.id = $1 AND EXISTS (SELECT 1 FROM {s} WHERE workflow_id = c.parent_id \
                 AND generation = c.parent_generation AND seq = c.parent_seq)"
            ),
            // A named-queue instance whose cancelled run has not stopped
            // yet keeps that run's hold on its slot (see `cancel_one`), and
            // is due when the hold ends: when the run lets go
            // (`Store::release_ended`) or at its expiry.
            retry: format!(
                "UPDATE {w} SET status = 'pending', attempts = 0, error = NULL, output = NULL, \
                 lease_owner = NULL, lease_expires_at = CASE WHEN {held} THEN lease_expires_at END, \
                 held_by = CASE WHEN {held} THEN held_by END, \
                 wake_at = CASE WHEN {held} THEN lease_expires_at ELSE $2 END, updated_at = $2, \
                 debounce_key = NULL WHERE id = $1",
                held = "queue IS NOT NULL AND lease_owner IS NULL AND lease_expires_at >= $2",
            ),
            fork_source: format!(
                "SELECT name, generation FROM {w} WHERE id = $1{}",
                d.lock_row
            ),
            // On the source's queue, priority and partition, so its limits
            // hold for the fork too (not its dedup key, which the source may
            // still hold).
            fork_instance: format!(
                "INSERT INTO {w} (id, name, generation, status, input, attempts, wake_at, \
                 created_at, updated_at, signature, app_version, skeleton_hash, queue, \
                 priority, partition_key) \
                 SELECT $2, name, 0, 'pending', input, 0, $3, $4, $3, signature, app_version, \
                 skeleton_hash, queue, priority, partition_key \
                 FROM {w} WHERE id = $1 \
                 ON CONFLICT (id) DO NOTHING"
            ),
            fork_steps: format!(
                "INSERT INTO {s} (workflow_id, generation, seq, name, kind, result, created_at, \
                 attempts, started_at) \
                 SELECT $2, 0, seq, name, kind, result, created_at, attempts, started_at \
                 FROM {s} WHERE workflow_id = $1 AND generation = $3 AND seq < $4"
            ),
            journal_entries: format!(
                "SELECT {STEP_COLUMNS}, created_at, attempts, started_at FROM {s} \
                 WHERE workflow_id = $1 AND generation = $2 ORDER BY seq"
            ),
        }
    }
}

/// One journal entry as operators see it ([`Store::load_journal_entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The entry.
    pub row: StepRow,
    /// How many times a step's body ran to reach it (`None` for entries that
    /// run no body, and for entries recorded before keiro kept it).
    pub attempts: Option<u32>,
    /// When a step body's first attempt began (µs since the Unix epoch).
    pub started_at: Option<i64>,
    /// When it was recorded (µs).
    pub recorded_at: i64,
}

impl FromRow for JournalEntry {
    fn from_row(r: &impl StoreRow) -> Result<Self> {
        let row = StepRow::from_row(r)?;
        let what = || {
            format!(
                "step {} of workflow instance `{}` (generation {})",
                row.seq, row.workflow_id, row.generation
            )
        };
        let attempts = r
            .maybe_int(what, "attempts")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        Ok(JournalEntry {
            attempts,
            started_at: r.maybe_int(what, "started_at")?,
            recorded_at: r.int(what, "created_at")?,
            row,
        })
    }
}

/// What [`Store::retry`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retry {
    /// The instance is `pending` again, due now, its journal kept.
    Retried,
    /// No instance has this id.
    NotFound,
    /// The instance has this status, which is not retried: only instances
    /// `failed` by crashes or errors keiro raised, and `cancelled` ones, are.
    NotRetryable(InstanceStatus),
    /// The instance is `failed` because its workflow returned `Err`: its
    /// journal would replay to the same error, so it is not retried.
    ReturnedError,
    /// The instance is a child whose parent recorded its result already:
    /// a new result would never reach the parent, so it is not retried.
    ParentRecorded {
        /// The child's status (failed or cancelled).
        status: InstanceStatus,
        /// The parent's id.
        parent_id: String,
        /// The parent's workflow name.
        parent_name: String,
    },
}

/// What [`Store::fork`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fork {
    /// The new instance is `pending`, due now, with this many journal rows
    /// copied.
    Forked {
        /// The journal rows copied (those before the fork's seq).
        steps: u64,
    },
    /// No instance has the source id.
    NotFound,
    /// An instance with the new id exists already; nothing was written.
    Conflict,
}

impl Store {
    /// Puts instance `id` back in line when it is `failed` (after its crash
    /// attempts, or by an error keiro raised: not by its workflow returning
    /// `Err`) or `cancelled`: `pending`, due now, attempts reset, error,
    /// output and lease cleared, its journal kept so recorded steps are not
    /// run again. An instance of a named queue cancelled while it ran, whose
    /// run has not stopped yet, keeps that run's hold on its queue slot and
    /// is due once the run lets go ([`Store::release_ended`]) or the hold's
    /// expiry passes: it does not start while its old run holds the slot,
    /// and that run cannot record an end for it. Anything else is left alone
    /// and named in the outcome, as is a child whose parent's journal holds
    /// its result already. Refused with [`StoreError::Duplicate`] when
    /// another unfinished instance took its queue's dedup key since it
    /// ended.
    pub async fn retry(&self, id: &str) -> Result<Retry> {
        crate::queue::twice_past_a_gone_holder(|| self.retry_once(id)).await
    }

    /// One try of [`Store::retry`].
    async fn retry_once(&self, id: &str) -> Result<Retry> {
        const OP: &str = "retry";
        validate_id("workflow id", id)?;
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let row: Option<(String, Option<String>)> =
                crate::prepared::query_as(&sql.operate.status_for_retry)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            let Some((status, output)) = row else {
                return crate::query::rolled_back(tx, OP, Retry::NotFound).await;
            };
            let status = rows::instance_status(id, &status)?;
            match status {
                InstanceStatus::Failed if output.is_some() => {
                    return crate::query::rolled_back(tx, OP, Retry::ReturnedError).await
                }
                InstanceStatus::Failed | InstanceStatus::Cancelled => {}
                other => {
                    return crate::query::rolled_back(tx, OP, Retry::NotRetryable(other)).await
                }
            }
            // A child whose parent still waits for it reports its new result
            // when it ends, as the first would have; one whose parent has its
            // result already would report into nothing.
            let recorded: Option<(String, String)> =
                crate::prepared::query_as(&sql.operate.parent_recorded)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            if let Some((parent_id, parent_name)) = recorded {
                return crate::query::rolled_back(
                    tx,
                    OP,
                    Retry::ParentRecorded {
                        status,
                        parent_id,
                        parent_name,
                    },
                )
                .await;
            }
            // Its dedup key went free when it ended: refuse if another took it.
            if let Some(duplicate) = crate::queue::dedup_taken((&mut *tx).into(), id).await? {
                let _ = crate::query::rolled_back(tx, OP, ()).await;
                return Err(duplicate);
            }
            let retried = crate::prepared::query(&sql.operate.retry)
                .bind(id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP));
            if let Err(error) = retried {
                let _ = crate::query::rolled_back(tx, OP, ()).await;
                return Err(self.key_taken_meanwhile(id, error).await);
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Retry::Retried)
        })
    }

    /// Every journal entry of generation `generation` of instance `id`, in
    /// order, with how and when each ran.
    pub async fn load_journal_entries(
        &self,
        id: &str,
        generation: i64,
    ) -> Result<Vec<JournalEntry>> {
        const OP: &str = "load_journal_entries";
        dispatch!(Store, self, |s, sql| {
            let rows = crate::prepared::query(&sql.operate.journal_entries)
                .bind(id)
                .bind(generation)
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter().map(JournalEntry::from_row).collect()
        })
    }

    /// In one transaction, starts instance `new_id` of the same workflow,
    /// input and signature as `id`'s current generation, `pending` and due
    /// now, with `id`'s journal rows of that generation before `from_seq`
    /// copied under `new_id` (generation 0): run by the current code, it
    /// replays them and runs on from `from_seq`. `id` is left alone.
    pub async fn fork(&self, id: &str, from_seq: i64, new_id: &str) -> Result<Fork> {
        const OP: &str = "fork";
        validate_id("workflow id", id)?;
        validate_id("workflow id", new_id)?;
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let source: Option<(String, i64)> = crate::prepared::query_as(&sql.operate.fork_source)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let Some((_name, generation)) = source else {
                return crate::query::rolled_back(tx, OP, Fork::NotFound).await;
            };
            // A fork takes its place on its source's queue as it is made.
            let created_at = self.clock().creation_stamps(1);
            let inserted = crate::prepared::query(&sql.operate.fork_instance)
                .bind(id)
                .bind(new_id)
                .bind(now)
                .bind(created_at)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected();
            if inserted == 0 {
                return crate::query::rolled_back(tx, OP, Fork::Conflict).await;
            }
            let steps = crate::prepared::query(&sql.operate.fork_steps)
                .bind(id)
                .bind(new_id)
                .bind(generation)
                .bind(from_seq)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected();
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Fork::Forked { steps })
        })
    }
}
