//! The resume worker's queries that pass its registered workflows, on
//! PostgreSQL: as parallel arrays of names and signatures, read with `ANY`
//! and `UNNEST`.

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;

use super::PostgresStore;
use crate::Registered;

/// A claimable instance's name is one of the registered names (`$n`), a
/// plain filter; its signature, unless unrecorded, is a hashed lookup of the
/// (name, signature) pairs (`$n`, `$n+1`).
pub(super) fn registered_match(n: usize) -> String {
    format!(
        "name = ANY(${n}) AND (signature IS NULL \
         OR (name, signature) IN (SELECT * FROM UNNEST(${n}::text[], ${}::text[])))",
        n + 1
    )
}

/// The elements of the JSON array of text at `param`.
pub(super) fn json_text_elements(param: &str) -> String {
    format!("SELECT json_array_elements_text(CAST({param} AS json))")
}

/// `id` is one of the ids `sub` picks, read into an array first so the
/// update looks each up by primary key whatever the plan's row estimate.
pub(super) fn any_of_array(sub: &str) -> String {
    format!("id = ANY(ARRAY({sub}))")
}

/// The registered names and signatures (at `$n`, `$n+1`) as a table.
pub(super) fn registered_rows(n: usize) -> String {
    format!(
        "UNNEST(${n}::text[], ${}::text[]) AS r(name, signature)",
        n + 1
    )
}

impl PostgresStore {
    /// Binds a worker's registered workflows: their names and their
    /// signatures as two parallel arrays, for `ANY` and `UNNEST`.
    pub(crate) fn bind_registered<'q>(
        &self,
        query: Query<'q, Postgres, PgArguments>,
        workflows: &'q [Registered<'q>],
    ) -> Query<'q, Postgres, PgArguments> {
        let (names, signatures): (Vec<&str>, Vec<&str>) =
            workflows.iter().map(|w| (w.name, w.signature)).unzip();
        query.bind(names).bind(signatures)
    }
}
