//! The resume worker's queries that pass its registered workflows, on
//! SQLite: as one JSON object of signatures by name, read with `json_each`.

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Sqlite, Transaction};

use super::SqliteStore;
use crate::{Registered, Result};

/// A claimable instance's name is a key of the registered workflows' JSON
/// object (`$5`), its signature that key's value or unrecorded.
pub(super) const REGISTERED_MATCH: &str = "EXISTS (SELECT 1 FROM json_each($5) r \
     WHERE r.key = keiro_workflows.name \
     AND (keiro_workflows.signature IS NULL OR keiro_workflows.signature = r.value))";

/// The registered workflows' JSON object (`$4`) as a table.
pub(super) const REGISTERED_ROWS: &str =
    "(SELECT key AS name, value AS signature FROM json_each($4)) r";

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
