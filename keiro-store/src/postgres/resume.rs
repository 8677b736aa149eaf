//! The resume worker's queries that pass its registered workflows, on
//! PostgreSQL: as parallel arrays of names and signatures, read with `ANY`
//! and `UNNEST`.

use std::sync::LazyLock;

use sqlx::{Postgres, Transaction};

use super::PostgresStore;
use crate::sql::INSTANCE_COLUMNS;
use crate::{now_ms, rows, Blocked, InstanceRow, Lease, Registered, Result, StoreError};

/// Takes due instances of registered workflows whose signature matches (or
/// was never recorded). `SKIP LOCKED`: workers claiming at once take disjoint
/// batches. The name test keeps the plain filter; the signature test is a
/// hashed lookup of the (name, signature) pairs, still one statement.
static CLAIM_DUE: LazyLock<String> = LazyLock::new(|| {
    let returning: Vec<String> = INSTANCE_COLUMNS
        .split(',')
        .map(|c| format!("w.{}", c.trim()))
        .collect();
    format!(
        "UPDATE keiro.workflows w SET lease_owner = $1, lease_expires_at = $2, \
         wake_at = $2, status = 'running', updated_at = $3 \
         FROM (SELECT id FROM keiro.workflows \
             WHERE status IN ('pending', 'running', 'suspended') AND wake_at <= $3 \
             AND (lease_owner IS NULL OR lease_owner = $1 OR lease_expires_at < $3) \
             AND name = ANY($4) \
             AND (signature IS NULL OR (name, signature) IN \
                 (SELECT * FROM UNNEST($4::text[], $6::text[]))) \
             ORDER BY wake_at LIMIT $5 FOR UPDATE SKIP LOCKED) due \
         WHERE w.id = due.id RETURNING {}",
        returning.join(", ")
    )
});

const FIND_BLOCKED: &str = "SELECT w.id, w.name, w.signature, r.signature AS registered \
     FROM keiro.workflows w \
     LEFT JOIN UNNEST($3::text[], $5::text[]) AS r(name, signature) ON r.name = w.name \
     WHERE w.status IN ('pending', 'running', 'suspended') AND w.wake_at <= $2 \
     AND (r.name IS NULL OR w.signature <> r.signature \
          OR (w.lease_owner IS NOT NULL AND w.lease_owner <> $1 \
              AND w.lease_expires_at >= $2)) \
     ORDER BY w.wake_at LIMIT $4";

const INSERT_WORKER_WORKFLOWS: &str =
    "INSERT INTO keiro.worker_workflows (executor_id, name) SELECT $1, unnest($2::text[])";

impl PostgresStore {
    pub(crate) async fn claim_due(
        &self,
        lease: Lease<'_>,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<InstanceRow>> {
        let (names, signatures) = split(workflows);
        let now = now_ms();
        let rows = sqlx::query(&CLAIM_DUE)
            .bind(lease.owner)
            .bind(now + lease.ttl_ms)
            .bind(now)
            .bind(names)
            .bind(limit)
            .bind(signatures)
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::query("claim_due"))?;
        rows.iter().map(rows::instance).collect()
    }

    pub(crate) async fn find_blocked(
        &self,
        owner: &str,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<Blocked>> {
        let (names, signatures) = split(workflows);
        let rows = sqlx::query(FIND_BLOCKED)
            .bind(owner)
            .bind(now_ms())
            .bind(names)
            .bind(limit)
            .bind(signatures)
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::query("find_blocked"))?;
        rows.iter().map(rows::blocked).collect()
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

/// The names and signatures of `workflows` as two parallel arrays, for `UNNEST`.
fn split<'a>(workflows: &[Registered<'a>]) -> (Vec<&'a str>, Vec<&'a str>) {
    workflows.iter().map(|w| (w.name, w.signature)).unzip()
}
