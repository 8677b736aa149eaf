//! The resume worker's queries that pass its registered workflows, on
//! SQLite: as one JSON object of signatures by name, read with `json_each`.

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Sqlite, Transaction};

use super::SqliteStore;
use crate::sql::INSTANCE_COLUMNS;
use crate::{Registered, Result};

/// Takes due instances of registered workflows whose signature matches (or
/// was never recorded), `$5` being the workflows' JSON. One statement:
/// SQLite takes the write lock before it reads, so two claimers never take
/// the same row.
pub(super) fn claim_due_sql() -> String {
    format!(
        "UPDATE keiro_workflows SET lease_owner = $1, lease_expires_at = $2, wake_at = $2, \
         status = 'running', updated_at = $3 \
         WHERE id IN (SELECT id FROM keiro_workflows \
             WHERE status IN ('pending', 'running', 'suspended') AND wake_at <= $3 \
             AND (lease_owner IS NULL OR lease_owner = $1 OR lease_expires_at < $3) \
             AND EXISTS (SELECT 1 FROM json_each($5) r WHERE r.key = keiro_workflows.name \
                 AND (keiro_workflows.signature IS NULL \
                      OR keiro_workflows.signature = r.value)) \
             ORDER BY wake_at LIMIT $4) \
         RETURNING {INSTANCE_COLUMNS}"
    )
}

/// Due instances a worker cannot claim, `$4` being the workflows' JSON.
pub(super) fn find_blocked_sql() -> String {
    "SELECT w.id, w.name, w.signature, r.value AS registered \
     FROM keiro_workflows w LEFT JOIN json_each($4) r ON r.key = w.name \
     WHERE w.status IN ('pending', 'running', 'suspended') AND w.wake_at <= $2 \
     AND (r.key IS NULL OR w.signature <> r.value \
          OR (w.lease_owner IS NOT NULL AND w.lease_owner <> $1 \
              AND w.lease_expires_at >= $2)) \
     ORDER BY w.wake_at LIMIT $3"
        .to_owned()
}

const INSERT_WORKER_WORKFLOWS: &str =
    "INSERT INTO keiro_worker_workflows (executor_id, name) SELECT $1, value FROM json_each($2)";

impl SqliteStore {
    /// Binds a worker's registered workflows: one JSON object of signatures
    /// by name, for `json_each` (`key`, `value`).
    pub(crate) fn bind_registered<'q>(
        &self,
        query: Query<'q, Sqlite, SqliteArguments<'q>>,
        workflows: &[Registered<'_>],
    ) -> Query<'q, Sqlite, SqliteArguments<'q>> {
        let map: serde_json::Map<String, serde_json::Value> = workflows
            .iter()
            .map(|w| (w.name.to_owned(), w.signature.into()))
            .collect();
        query.bind(serde_json::Value::Object(map).to_string())
    }

    pub(crate) async fn insert_worker_workflows(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        executor_id: &str,
        names: &[&str],
    ) -> Result<(), sqlx::Error> {
        let names = serde_json::to_string(names).expect("names encode as JSON");
        sqlx::query(INSERT_WORKER_WORKFLOWS)
            .bind(executor_id)
            .bind(names)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
}
