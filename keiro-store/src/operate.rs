//! Repairing instances from outside: [`Store::retry`] puts a failed or
//! cancelled instance back in line with its journal, [`Store::fork`] starts a
//! new instance from a prefix of another's journal.

use crate::sql::Dialect;
use crate::validate::validate_id;
use crate::{now_us, rows, InstanceStatus, Result, Store, StoreError};

/// The statements of [`Store::retry`] and [`Store::fork`].
#[derive(Debug)]
pub(crate) struct OperateStatements {
    /// The status and output of one instance, its row locked.
    status_for_retry: String,
    /// Puts one instance back to `pending`, due now, attempts reset.
    retry: String,
    /// The name and generation of the instance forked from, its row locked.
    fork_source: String,
    /// Inserts the fork's row from the source's (nothing on an id conflict).
    fork_instance: String,
    /// Copies the source's journal prefix under the fork's id.
    fork_steps: String,
}

impl OperateStatements {
    pub(crate) fn new(d: &Dialect) -> OperateStatements {
        let (w, s) = (
            format!("{}workflows", d.tables),
            format!("{}steps", d.tables),
        );
        OperateStatements {
            status_for_retry: format!("SELECT status, output FROM {w} WHERE id = $1{}", d.lock_row),
            retry: format!(
                "UPDATE {w} SET status = 'pending', attempts = 0, error = NULL, output = NULL, \
                 lease_owner = NULL, lease_expires_at = NULL, wake_at = $2, updated_at = $2 \
                 WHERE id = $1"
            ),
            fork_source: format!(
                "SELECT name, generation FROM {w} WHERE id = $1{}",
                d.lock_row
            ),
            fork_instance: format!(
                "INSERT INTO {w} (id, name, generation, status, input, attempts, wake_at, \
                 created_at, updated_at, signature) \
                 SELECT $2, name, 0, 'pending', input, 0, $3, $3, $3, signature \
                 FROM {w} WHERE id = $1 \
                 ON CONFLICT (id) DO NOTHING"
            ),
            fork_steps: format!(
                "INSERT INTO {s} (workflow_id, generation, seq, name, kind, result, created_at) \
                 SELECT $2, 0, seq, name, kind, result, created_at FROM {s} \
                 WHERE workflow_id = $1 AND generation = $3 AND seq < $4"
            ),
        }
    }
}

/// What [`Store::retry`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// run again. Anything else is left alone and named in the outcome.
    pub async fn retry(&self, id: &str) -> Result<Retry> {
        const OP: &str = "retry";
        validate_id("workflow id", id)?;
        let now = now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let row: Option<(String, Option<String>)> =
                sqlx::query_as(&sql.operate.status_for_retry)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            let Some((status, output)) = row else {
                return Ok(Retry::NotFound);
            };
            match rows::instance_status(id, &status)? {
                InstanceStatus::Failed if output.is_some() => return Ok(Retry::ReturnedError),
                InstanceStatus::Failed | InstanceStatus::Cancelled => {}
                other => return Ok(Retry::NotRetryable(other)),
            }
            sqlx::query(&sql.operate.retry)
                .bind(id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Retry::Retried)
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
        let now = now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let source: Option<(String, i64)> = sqlx::query_as(&sql.operate.fork_source)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let Some((_name, generation)) = source else {
                return Ok(Fork::NotFound);
            };
            let inserted = sqlx::query(&sql.operate.fork_instance)
                .bind(id)
                .bind(new_id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected();
            if inserted == 0 {
                return Ok(Fork::Conflict);
            }
            let steps = sqlx::query(&sql.operate.fork_steps)
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
