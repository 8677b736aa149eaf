//! The resume worker's queries that pass its registered workflows, on
//! SQLite: as one JSON object of signatures by name, read with `json_each`.

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::Sqlite;

use super::SqliteStore;
use crate::Registered;

/// A claimable instance's name is a key of the registered workflows' JSON
/// object (`$n`), its signature that key's value or unrecorded.
pub(super) fn registered_match(n: usize) -> String {
    format!(
        "EXISTS (SELECT 1 FROM json_each(${n}) r WHERE r.key = keiro_workflows.name \
         AND (keiro_workflows.signature IS NULL OR keiro_workflows.signature = r.value))"
    )
}

/// The elements of the JSON array of text at `param`.
pub(super) fn json_text_elements(param: &str) -> String {
    format!("SELECT value FROM json_each({param})")
}

/// The registered workflows' JSON object (at `$n`) as a table.
pub(super) fn registered_rows(n: usize) -> String {
    format!("(SELECT key AS name, value AS signature FROM json_each(${n})) r")
}

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
}
