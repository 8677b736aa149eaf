//! Which workflow names each live resume worker serves, so a caller waiting
//! on an instance can tell when no worker will ever run it (a binary that
//! never linked the crate defining the workflow, say).

use sqlx::Row;

use crate::{PostgresStore, Result, SqliteStore, StoreError};

impl SqliteStore {
    pub(crate) async fn register_workflows(&self, executor_id: &str, names: &[&str]) -> Result<()> {
        let names = serde_json::to_string(names).expect("names encode as JSON");
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("register_workflows"))?;
        sqlx::query("DELETE FROM keiro_worker_workflows WHERE executor_id = ?1")
            .bind(executor_id)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("register_workflows"))?;
        sqlx::query(
            "INSERT INTO keiro_worker_workflows (executor_id, name) \
             SELECT ?1, value FROM json_each(?2)",
        )
        .bind(executor_id)
        .bind(names)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("register_workflows"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("register_workflows"))
    }

    pub(crate) async fn is_served(&self, name: &str, alive_since: i64) -> Result<bool> {
        sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM keiro_worker_workflows w \
             JOIN keiro_executors e ON e.id = w.executor_id \
             WHERE w.name = ?1 AND e.heartbeat_at >= ?2) AS served",
        )
        .bind(name)
        .bind(alive_since)
        .fetch_one(self.pool())
        .await
        .and_then(|row| row.try_get::<bool, _>("served"))
        .map_err(StoreError::query("is_served"))
    }
}

impl PostgresStore {
    pub(crate) async fn register_workflows(&self, executor_id: &str, names: &[&str]) -> Result<()> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("register_workflows"))?;
        sqlx::query("DELETE FROM keiro.worker_workflows WHERE executor_id = $1")
            .bind(executor_id)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("register_workflows"))?;
        sqlx::query(
            "INSERT INTO keiro.worker_workflows (executor_id, name) \
             SELECT $1, unnest($2::text[])",
        )
        .bind(executor_id)
        .bind(names)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("register_workflows"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("register_workflows"))
    }

    pub(crate) async fn is_served(&self, name: &str, alive_since: i64) -> Result<bool> {
        sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM keiro.worker_workflows w \
             JOIN keiro.executors e ON e.id = w.executor_id \
             WHERE w.name = $1 AND e.heartbeat_at >= $2) AS served",
        )
        .bind(name)
        .bind(alive_since)
        .fetch_one(self.pool())
        .await
        .and_then(|row| row.try_get::<bool, _>("served"))
        .map_err(StoreError::query("is_served"))
    }
}
