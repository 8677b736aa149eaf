//! The resume worker's queries that pass its registered workflows, on
//! PostgreSQL: as parallel arrays of names and signatures, read with `ANY`
//! and `UNNEST`.

use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Postgres, Transaction};

use super::PostgresStore;
use crate::sql::INSTANCE_COLUMNS;
use crate::{Registered, Result};

/// Takes due instances of registered workflows whose signature matches (or
/// was never recorded), `$5` and `$6` being their names and signatures.
/// `SKIP LOCKED`: workers claiming at once take disjoint batches. The name
/// test keeps the plain filter; the signature test is a hashed lookup of the
/// (name, signature) pairs, still one statement.
pub(super) fn claim_due_sql() -> String {
    format!(
        "UPDATE keiro.workflows SET lease_owner = $1, lease_expires_at = $2, \
         wake_at = $2, status = 'running', updated_at = $3 \
         FROM (SELECT id AS due_id FROM keiro.workflows \
             WHERE status IN ('pending', 'running', 'suspended') AND wake_at <= $3 \
             AND (lease_owner IS NULL OR lease_owner = $1 OR lease_expires_at < $3) \
             AND name = ANY($5) \
             AND (signature IS NULL OR (name, signature) IN \
                 (SELECT * FROM UNNEST($5::text[], $6::text[]))) \
             ORDER BY wake_at LIMIT $4 FOR UPDATE SKIP LOCKED) due \
         WHERE id = due.due_id RETURNING {INSTANCE_COLUMNS}"
    )
}

/// Due instances a worker cannot claim, `$4` and `$5` being the names and
/// signatures of its workflows.
pub(super) fn find_blocked_sql() -> String {
    "SELECT w.id, w.name, w.signature, r.signature AS registered \
     FROM keiro.workflows w \
     LEFT JOIN UNNEST($4::text[], $5::text[]) AS r(name, signature) ON r.name = w.name \
     WHERE w.status IN ('pending', 'running', 'suspended') AND w.wake_at <= $2 \
     AND (r.name IS NULL OR w.signature <> r.signature \
          OR (w.lease_owner IS NOT NULL AND w.lease_owner <> $1 \
              AND w.lease_expires_at >= $2)) \
     ORDER BY w.wake_at LIMIT $3"
        .to_owned()
}

const INSERT_WORKER_WORKFLOWS: &str =
    "INSERT INTO keiro.worker_workflows (executor_id, name) SELECT $1, unnest($2::text[])";

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

    pub(crate) async fn insert_worker_workflows(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        executor_id: &str,
        names: &[&str],
    ) -> Result<(), sqlx::Error> {
        sqlx::query(INSERT_WORKER_WORKFLOWS)
            .bind(executor_id)
            .bind(names)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
}
