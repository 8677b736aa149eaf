//! The embedded SQLite backend: one file, WAL, one writer.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous as Sync,
};
use sqlx::Row;

use crate::error::redact;
use crate::types::parse_status;
use crate::{
    now_ms, AppendOutcome, BlockReason, Blocked, Cancellation, Crash, ExecutorRow, Finish,
    InstanceRow, InstanceStatus, Lease, NewInstance, Registered, Resolution, Result,
    SqliteSynchronous, StepRow, StoreError, StoreOptions,
};

/// Rows per multi-row insert (7 parameters each, well under SQLite's limit).
const APPEND_CHUNK: usize = 256;

/// The SQLite migrations, embedded at build time.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

const INSTANCE_COLUMNS: &str = "id, name, generation, status, input, first_input, signature, \
     output, error, attempts, lease_owner, lease_expires_at, wake_at, parent_id, parent_seq, \
     created_at, updated_at";

/// The SQLite journal store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the SQLite database at `url` in WAL mode and
    /// migrates it.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<SqliteStore> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::InvalidUrl {
                url: redact(url),
                reason: e.to_string(),
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.sqlite_synchronous {
                SqliteSynchronous::Full => Sync::Full,
                SqliteSynchronous::Normal => Sync::Normal,
            })
            .busy_timeout(Duration::from_secs(30));
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let pool_options = SqlitePoolOptions::new()
            // An in-memory database lives in one connection; a file serves
            // concurrent readers beside its single writer.
            .max_connections(if in_memory {
                1
            } else {
                options.max_connections.unwrap_or(4)
            })
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None);
        // Opening sets pragmas that can meet another process's write lock
        // before the busy timeout applies: retry that briefly.
        let mut attempt = 0;
        let pool = loop {
            match pool_options.clone().connect_with(connect.clone()).await {
                Ok(pool) => break pool,
                Err(e) if attempt < 50 && is_busy(&e) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => {
                    return Err(StoreError::Connect {
                        url: redact(url),
                        source: Arc::new(e),
                    })
                }
            }
        };
        SQLITE_MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Migrate {
                backend: "sqlite",
                source: Arc::new(e),
            })?;
        Ok(SqliteStore { pool })
    }

    /// The underlying pool, for tests and benchmarks.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub(crate) async fn create_instance(
        &self,
        new: &NewInstance<'_>,
    ) -> Result<(InstanceRow, bool)> {
        Ok(self
            .create_instances(std::slice::from_ref(new))
            .await?
            .remove(0))
    }

    pub(crate) async fn create_instances(
        &self,
        news: &[NewInstance<'_>],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        let now = now_ms();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("create_instance"))?;
        let mut created = Vec::with_capacity(news.len());
        for new in news {
            created.push(create_on(&mut tx, new, now).await?);
        }
        tx.commit()
            .await
            .map_err(StoreError::query("create_instance"))?;
        Ok(created)
    }

    pub(crate) async fn get_instance(&self, id: &str) -> Result<Option<InstanceRow>> {
        let row = sqlx::query(&format!(
            "SELECT {INSTANCE_COLUMNS} FROM keiro_workflows WHERE id = ?1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("get_instance"))?;
        row.as_ref().map(instance_from_row).transpose()
    }

    pub(crate) async fn claim(&self, id: &str, lease: Lease<'_>) -> Result<Option<InstanceRow>> {
        let now = now_ms();
        let row = sqlx::query(&format!(
            "UPDATE keiro_workflows SET lease_owner = ?2, lease_expires_at = ?3, wake_at = ?3, \
             status = 'running', updated_at = ?4 \
             WHERE id = ?1 AND status IN ('pending', 'running', 'suspended') \
             AND (lease_owner IS NULL OR lease_owner = ?2 OR lease_expires_at < ?4) \
             RETURNING {INSTANCE_COLUMNS}"
        ))
        .bind(id)
        .bind(lease.owner)
        .bind(now + lease.ttl_ms)
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("claim"))?;
        row.as_ref().map(instance_from_row).transpose()
    }

    pub(crate) async fn renew_lease(&self, id: &str, lease: Lease<'_>) -> Result<bool> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE keiro_workflows SET lease_expires_at = ?3, wake_at = ?3 \
             WHERE id = ?1 AND lease_owner = ?2 AND status IN ('pending', 'running', 'suspended')",
        )
        .bind(id)
        .bind(lease.owner)
        .bind(now + lease.ttl_ms)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("renew_lease"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn release(&self, id: &str, owner: &str) -> Result<()> {
        sqlx::query(
            "UPDATE keiro_workflows SET lease_owner = NULL, lease_expires_at = NULL, \
             wake_at = CASE WHEN status IN ('pending', 'running', 'suspended') THEN ?3 \
             ELSE NULL END, updated_at = ?3 WHERE id = ?1 AND lease_owner = ?2",
        )
        .bind(id)
        .bind(owner)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("release"))?;
        Ok(())
    }

    pub(crate) async fn load_journal(&self, id: &str, generation: i64) -> Result<Vec<StepRow>> {
        let rows = sqlx::query(
            "SELECT workflow_id, generation, seq, name, kind, result FROM keiro_steps \
             WHERE workflow_id = ?1 AND generation = ?2 ORDER BY seq",
        )
        .bind(id)
        .bind(generation)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("load_journal"))?;
        rows.iter().map(step_from_row).collect()
    }

    pub(crate) async fn append_steps(&self, rows: &[StepRow]) -> Result<Vec<AppendOutcome>> {
        let now = now_ms();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("append_steps"))?;
        // Multi-row inserts: a statement costs a round trip to SQLite's
        // thread, so a batch pays one per chunk instead of one per row.
        let mut inserted: HashSet<(String, i64, i64)> = HashSet::with_capacity(rows.len());
        for chunk in rows.chunks(APPEND_CHUNK) {
            let values = vec!["(?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let sql = format!(
                "INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, \
                 created_at) VALUES {values} \
                 ON CONFLICT (workflow_id, generation, seq) DO NOTHING \
                 RETURNING workflow_id, generation, seq"
            );
            let mut query = sqlx::query(&sql);
            for step in chunk {
                query = query
                    .bind(&step.workflow_id)
                    .bind(step.generation)
                    .bind(step.seq)
                    .bind(&step.name)
                    .bind(&step.kind)
                    .bind(&step.result)
                    .bind(now);
            }
            for row in query
                .fetch_all(&mut *tx)
                .await
                .map_err(StoreError::query("append_steps"))?
            {
                inserted.insert((
                    row.try_get("workflow_id").map_err(corrupt)?,
                    row.try_get("generation").map_err(corrupt)?,
                    row.try_get("seq").map_err(corrupt)?,
                ));
            }
        }
        // The first row of a step id in the batch speaks for it; a step id
        // recorded before the batch keeps its first result.
        let mut first: HashMap<(&str, i64, i64), AppendOutcome> = HashMap::new();
        let mut outcomes = Vec::with_capacity(rows.len());
        for step in rows {
            let key = (step.workflow_id.as_str(), step.generation, step.seq);
            if let Some(earlier) = first.get(&key) {
                outcomes.push(match earlier {
                    AppendOutcome::Inserted => {
                        let winner = rows
                            .iter()
                            .find(|r| (r.workflow_id.as_str(), r.generation, r.seq) == key)
                            .cloned()
                            .expect("the first row of this key is in the batch");
                        AppendOutcome::Existing(winner)
                    }
                    existing => existing.clone(),
                });
                continue;
            }
            let owned = (step.workflow_id.clone(), step.generation, step.seq);
            let outcome = if inserted.contains(&owned) {
                AppendOutcome::Inserted
            } else {
                let existing = sqlx::query(
                    "SELECT workflow_id, generation, seq, name, kind, result FROM keiro_steps \
                     WHERE workflow_id = ?1 AND generation = ?2 AND seq = ?3",
                )
                .bind(&step.workflow_id)
                .bind(step.generation)
                .bind(step.seq)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query("append_steps"))?;
                AppendOutcome::Existing(step_from_row(&existing)?)
            };
            first.insert(key, outcome.clone());
            outcomes.push(outcome);
        }
        tx.commit()
            .await
            .map_err(StoreError::query("append_steps"))?;
        Ok(outcomes)
    }

    pub(crate) async fn finish(&self, finish: &Finish<'_>) -> Result<bool> {
        Ok(self
            .finish_many(std::slice::from_ref(finish))
            .await?
            .remove(0))
    }

    pub(crate) async fn finish_many(&self, finishes: &[Finish<'_>]) -> Result<Vec<bool>> {
        let now = now_ms();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("finish"))?;
        let mut applied = Vec::with_capacity(finishes.len());
        for finish in finishes {
            applied.push(finish_on(&mut tx, finish, now).await?);
        }
        tx.commit().await.map_err(StoreError::query("finish"))?;
        Ok(applied)
    }

    pub(crate) async fn suspend(
        &self,
        id: &str,
        generation: i64,
        owner: &str,
        wake_at: Option<i64>,
        awaiting: Option<i64>,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE keiro_workflows SET status = 'suspended', lease_owner = NULL, \
             lease_expires_at = NULL, updated_at = ?5, \
             wake_at = CASE WHEN ?6 IS NOT NULL AND EXISTS (SELECT 1 FROM keiro_steps \
                 WHERE workflow_id = ?1 AND generation = ?2 AND seq = ?6) THEN ?5 ELSE ?4 END \
             WHERE id = ?1 AND generation = ?2 AND lease_owner = ?3 AND status = 'running'",
        )
        .bind(id)
        .bind(generation)
        .bind(owner)
        .bind(wake_at)
        .bind(now_ms())
        .bind(awaiting)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("suspend"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn get_step(
        &self,
        id: &str,
        generation: i64,
        seq: i64,
    ) -> Result<Option<StepRow>> {
        let row = sqlx::query(
            "SELECT workflow_id, generation, seq, name, kind, result FROM keiro_steps \
             WHERE workflow_id = ?1 AND generation = ?2 AND seq = ?3",
        )
        .bind(id)
        .bind(generation)
        .bind(seq)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("get_step"))?;
        row.as_ref().map(step_from_row).transpose()
    }

    pub(crate) async fn resolve(
        &self,
        created: i64,
        kind: &str,
        row: &StepRow,
    ) -> Result<Resolution> {
        let now = now_ms();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("resolve"))?;
        let exists = sqlx::query(
            "SELECT 1 FROM keiro_steps WHERE workflow_id = ?1 AND generation = ?2 AND seq = ?3 \
             AND kind = ?4",
        )
        .bind(&row.workflow_id)
        .bind(row.generation)
        .bind(created)
        .bind(kind)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query("resolve"))?
        .is_some();
        if !exists {
            return Ok(Resolution::Unknown);
        }
        let inserted = sqlx::query(
            "INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, \
             created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (workflow_id, generation, seq) DO NOTHING",
        )
        .bind(&row.workflow_id)
        .bind(row.generation)
        .bind(row.seq)
        .bind(&row.name)
        .bind(&row.kind)
        .bind(&row.result)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("resolve"))?
        .rows_affected()
            == 1;
        if !inserted {
            let first = sqlx::query(
                "SELECT workflow_id, generation, seq, name, kind, result FROM keiro_steps \
                 WHERE workflow_id = ?1 AND generation = ?2 AND seq = ?3",
            )
            .bind(&row.workflow_id)
            .bind(row.generation)
            .bind(row.seq)
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::query("resolve"))?;
            return Ok(Resolution::AlreadyResolved(step_from_row(&first)?));
        }
        sqlx::query(
            "UPDATE keiro_workflows SET wake_at = ?3, updated_at = ?3 \
             WHERE id = ?1 AND generation = ?2 AND status = 'suspended'",
        )
        .bind(&row.workflow_id)
        .bind(row.generation)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("resolve"))?;
        tx.commit().await.map_err(StoreError::query("resolve"))?;
        Ok(Resolution::Recorded)
    }

    pub(crate) async fn cancel(&self, id: &str) -> Result<Cancellation> {
        let now = now_ms();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("cancel"))?;
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM keiro_workflows WHERE id = ?1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query("cancel"))?;
        let Some(status) = status else {
            return Ok(Cancellation::NotFound);
        };
        let status = parse_status(id, &status)?;
        if status.is_final() {
            return Ok(Cancellation::AlreadyFinal(status));
        }
        let ids: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE tree(id) AS ( \
                 SELECT ?1 \
                 UNION SELECT w.id FROM keiro_workflows w JOIN tree ON w.parent_id = tree.id \
             ) \
             SELECT w.id FROM keiro_workflows w JOIN tree ON w.id = tree.id \
             WHERE w.status IN ('pending', 'running', 'suspended')",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::query("cancel"))?;
        for cancelled in &ids {
            sqlx::query(
                "UPDATE keiro_workflows SET status = 'cancelled', error = 'cancelled', \
                 lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL, updated_at = ?2 \
                 WHERE id = ?1",
            )
            .bind(cancelled)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("cancel"))?;
            report_to_parent(&mut tx, cancelled, now).await?;
        }
        tx.commit().await.map_err(StoreError::query("cancel"))?;
        let mut ordered = vec![id.to_owned()];
        ordered.extend(ids.into_iter().filter(|c| c != id));
        Ok(Cancellation::Cancelled(ordered))
    }

    pub(crate) async fn count_pending_awakeables(&self) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM keiro_steps a JOIN keiro_workflows w \
             ON w.id = a.workflow_id AND w.generation = a.generation \
             WHERE a.kind = 'awakeable' AND w.status IN ('pending', 'running', 'suspended') \
             AND NOT EXISTS (SELECT 1 FROM keiro_steps r WHERE r.workflow_id = a.workflow_id \
                 AND r.generation = a.generation AND r.seq = a.seq + 1)",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::query("count_pending_awakeables"))?;
        Ok(n.max(0) as u64)
    }

    pub(crate) async fn continue_as_new(
        &self,
        id: &str,
        generation: i64,
        owner: &str,
        input: &str,
    ) -> Result<bool> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE keiro_workflows SET generation = generation + 1, input = ?4, \
             first_input = COALESCE(first_input, input), \
             status = 'pending', attempts = 0, error = NULL, output = NULL, lease_owner = NULL, \
             lease_expires_at = NULL, wake_at = ?5, updated_at = ?5 \
             WHERE id = ?1 AND generation = ?2 AND lease_owner = ?3 AND status = 'running'",
        )
        .bind(id)
        .bind(generation)
        .bind(owner)
        .bind(input)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("continue_as_new"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn requeue_set_aside(&self, id: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE keiro_workflows SET status = 'pending', error = NULL, wake_at = ?2, \
             updated_at = ?2 WHERE id = ?1 AND status = 'nondeterministic'",
        )
        .bind(id)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("requeue_set_aside"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn find_due(&self, limit: i64) -> Result<Vec<InstanceRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {INSTANCE_COLUMNS} FROM keiro_workflows \
             WHERE status IN ('pending', 'running', 'suspended') AND wake_at <= ?1 \
             ORDER BY wake_at LIMIT ?2"
        ))
        .bind(now_ms())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("find_due"))?;
        rows.iter().map(instance_from_row).collect()
    }

    pub(crate) async fn claim_due(
        &self,
        lease: Lease<'_>,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<InstanceRow>> {
        let now = now_ms();
        let rows = sqlx::query(&format!(
            "UPDATE keiro_workflows SET lease_owner = ?1, lease_expires_at = ?2, wake_at = ?2, \
             status = 'running', updated_at = ?3 \
             WHERE id IN (SELECT id FROM keiro_workflows \
                 WHERE status IN ('pending', 'running', 'suspended') AND wake_at <= ?3 \
                 AND (lease_owner IS NULL OR lease_owner = ?1 OR lease_expires_at < ?3) \
                 AND EXISTS (SELECT 1 FROM json_each(?4) r WHERE r.key = keiro_workflows.name \
                     AND (keiro_workflows.signature IS NULL \
                          OR keiro_workflows.signature = r.value)) \
                 ORDER BY wake_at LIMIT ?5) \
             RETURNING {INSTANCE_COLUMNS}"
        ))
        .bind(lease.owner)
        .bind(now + lease.ttl_ms)
        .bind(now)
        .bind(workflows_json(workflows))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("claim_due"))?;
        rows.iter().map(instance_from_row).collect()
    }

    pub(crate) async fn find_blocked(
        &self,
        owner: &str,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<Blocked>> {
        let now = now_ms();
        let rows = sqlx::query(
            "SELECT w.id, w.name, w.signature, r.value AS registered \
             FROM keiro_workflows w LEFT JOIN json_each(?3) r ON r.key = w.name \
             WHERE w.status IN ('pending', 'running', 'suspended') AND w.wake_at <= ?2 \
             AND (r.key IS NULL OR w.signature <> r.value \
                  OR (w.lease_owner IS NOT NULL AND w.lease_owner <> ?1 \
                      AND w.lease_expires_at >= ?2)) \
             ORDER BY w.wake_at LIMIT ?4",
        )
        .bind(owner)
        .bind(now)
        .bind(workflows_json(workflows))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("find_blocked"))?;
        rows.iter()
            .map(|row| {
                Ok(Blocked {
                    id: row.try_get("id").map_err(corrupt)?,
                    name: row.try_get("name").map_err(corrupt)?,
                    reason: BlockReason::of(
                        row.try_get("signature").map_err(corrupt)?,
                        row.try_get("registered").map_err(corrupt)?,
                    ),
                })
            })
            .collect()
    }

    pub(crate) async fn reclaim_own(&self, owner: &str) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE keiro_workflows SET wake_at = ?2 WHERE lease_owner = ?1 \
             AND status IN ('pending', 'running', 'suspended')",
        )
        .bind(owner)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("reclaim_own"))?;
        Ok(done.rows_affected())
    }

    pub(crate) async fn record_crash(
        &self,
        crash: &Crash<'_>,
    ) -> Result<Option<(InstanceStatus, i64)>> {
        let now = now_ms();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("record_crash"))?;
        let row = sqlx::query(
            "UPDATE keiro_workflows SET attempts = attempts + 1, error = ?3, \
             status = CASE WHEN attempts + 1 >= ?4 THEN 'failed' ELSE status END, \
             wake_at = CASE WHEN attempts + 1 >= ?4 THEN NULL ELSE ?5 END, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = ?6 \
             WHERE id = ?1 AND lease_owner = ?2 AND status IN ('pending', 'running', 'suspended') \
             RETURNING status, attempts",
        )
        .bind(crash.id)
        .bind(crash.owner)
        .bind(crash.error)
        .bind(crash.max_attempts)
        .bind(crash.retry_at)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query("record_crash"))?;
        let outcome = match row {
            None => None,
            Some(row) => {
                let status: String = row.try_get("status").map_err(corrupt)?;
                let attempts: i64 = row.try_get("attempts").map_err(corrupt)?;
                Some((parse_status(crash.id, &status)?, attempts))
            }
        };
        if let Some((InstanceStatus::Failed, _)) = outcome {
            report_to_parent(&mut tx, crash.id, now).await?;
        }
        tx.commit()
            .await
            .map_err(StoreError::query("record_crash"))?;
        Ok(outcome)
    }

    pub(crate) async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRow>> {
        let row = sqlx::query(
            "SELECT id, token, host, pid, heartbeat_at FROM keiro_executors WHERE id = ?1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("get_executor"))?;
        row.as_ref().map(executor_from_row).transpose()
    }

    pub(crate) async fn list_executors(&self, base: &str) -> Result<Vec<ExecutorRow>> {
        let rows = sqlx::query(
            "SELECT id, token, host, pid, heartbeat_at FROM keiro_executors \
             WHERE id = ?1 OR substr(id, 1, length(?2)) = ?2 ORDER BY id",
        )
        .bind(base)
        .bind(format!("{base}#"))
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("list_executors"))?;
        rows.iter().map(executor_from_row).collect()
    }

    pub(crate) async fn put_executor(
        &self,
        executor: &ExecutorRow,
        replacing: Option<&str>,
    ) -> Result<bool> {
        let done = match replacing {
            None => sqlx::query(
                "INSERT INTO keiro_executors (id, token, host, pid, heartbeat_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (id) DO NOTHING",
            ),
            Some(_) => sqlx::query(
                "UPDATE keiro_executors SET token = ?2, host = ?3, pid = ?4, heartbeat_at = ?5 \
                 WHERE id = ?1 AND token = ?6",
            ),
        }
        .bind(&executor.id)
        .bind(&executor.token)
        .bind(&executor.host)
        .bind(executor.pid)
        .bind(executor.heartbeat_at);
        let done = match replacing {
            None => done,
            Some(old) => done.bind(old),
        }
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("put_executor"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn heartbeat_executor(&self, id: &str, token: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE keiro_executors SET heartbeat_at = ?3 WHERE id = ?1 AND token = ?2",
        )
        .bind(id)
        .bind(token)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("heartbeat_executor"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn remove_executor(&self, id: &str, token: &str) -> Result<Option<u64>> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("remove_executor"))?;
        let removed = sqlx::query("DELETE FROM keiro_executors WHERE id = ?1 AND token = ?2")
            .bind(id)
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("remove_executor"))?;
        if removed.rows_affected() == 0 {
            return Ok(None);
        }
        sqlx::query("DELETE FROM keiro_worker_workflows WHERE executor_id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("remove_executor"))?;
        // In the same transaction, so no process can take the identity (and
        // its leases) between the two.
        let released = sqlx::query(
            "UPDATE keiro_workflows SET lease_owner = NULL, lease_expires_at = NULL, \
             wake_at = ?2, updated_at = ?2 \
             WHERE lease_owner = ?1 AND status IN ('pending', 'running', 'suspended')",
        )
        .bind(id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("remove_executor"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("remove_executor"))?;
        Ok(Some(released.rows_affected()))
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}

/// Records a new instance, or reads the existing one with its id.
async fn create_on(
    conn: &mut SqliteConnection,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)> {
    let (status, owner, expires) = match new.lease {
        Some(lease) => (
            InstanceStatus::Running,
            Some(lease.owner),
            Some(now + lease.ttl_ms),
        ),
        None => (InstanceStatus::Pending, None, None),
    };
    let inserted = sqlx::query(
        "INSERT INTO keiro_workflows (id, name, generation, status, input, attempts, \
         lease_owner, lease_expires_at, wake_at, parent_id, parent_seq, parent_generation, \
         created_at, updated_at, signature) \
         VALUES (?1, ?2, 0, ?3, ?4, 0, ?5, ?6, COALESCE(?6, ?9), ?7, ?8, ?10, ?9, ?9, ?11) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(new.id)
    .bind(new.name)
    .bind(status.as_str())
    .bind(new.input)
    .bind(owner)
    .bind(expires)
    .bind(new.parent.map(|p| p.id))
    .bind(new.parent.map(|p| p.seq))
    .bind(now)
    .bind(new.parent.map(|p| p.generation))
    .bind(new.signature)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("create_instance"))?
    .rows_affected()
        == 1;
    let row = sqlx::query(&format!(
        "SELECT {INSTANCE_COLUMNS} FROM keiro_workflows WHERE id = ?1"
    ))
    .bind(new.id)
    .fetch_one(&mut *conn)
    .await
    .map_err(StoreError::query("create_instance"))?;
    Ok((instance_from_row(&row)?, inserted))
}

/// Moves an unfinished instance to a final status and reports to its parent.
async fn finish_on(conn: &mut SqliteConnection, finish: &Finish<'_>, now: i64) -> Result<bool> {
    let updated: Option<bool> = sqlx::query_scalar(
        "UPDATE keiro_workflows SET status = ?4, output = ?5, error = ?6, \
         lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL, updated_at = ?7 \
         WHERE id = ?1 AND generation = ?2 \
         AND status IN ('pending', 'running', 'suspended') \
         AND (lease_owner IS NULL OR lease_owner = ?3) \
         RETURNING parent_id IS NOT NULL AS has_parent",
    )
    .bind(finish.id)
    .bind(finish.generation)
    .bind(finish.owner)
    .bind(finish.status.as_str())
    .bind(finish.output)
    .bind(finish.error)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query("finish"))?;
    // Only a child reports to a parent; most instances have none.
    if updated == Some(true) {
        report_to_parent(conn, finish.id, now).await?;
    }
    Ok(updated.is_some())
}

/// Records a child's end in its parent's journal (the step the parent awaits)
/// and makes a suspended parent due; nothing for an instance without a parent.
async fn report_to_parent(conn: &mut SqliteConnection, child: &str, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, created_at) \
         SELECT parent_id, parent_generation, parent_seq, name, 'child', \
             CASE WHEN output IS NOT NULL AND status IN ('completed', 'failed') \
                  THEN '{\"Ok\":' || output || '}' \
                  ELSE json_object('Err', json_object('status', status, \
                      'message', COALESCE(error, ''))) END, \
             ?2 \
         FROM keiro_workflows WHERE id = ?1 AND parent_id IS NOT NULL \
         AND status <> 'nondeterministic' \
         ON CONFLICT (workflow_id, generation, seq) DO NOTHING",
    )
    .bind(child)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("report_to_parent"))?;
    sqlx::query(
        "UPDATE keiro_workflows SET wake_at = ?2, updated_at = ?2 WHERE status = 'suspended' \
         AND id = (SELECT parent_id FROM keiro_workflows WHERE id = ?1)",
    )
    .bind(child)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("report_to_parent"))?;
    Ok(())
}

fn instance_from_row(row: &SqliteRow) -> Result<InstanceRow> {
    let id: String = row.try_get("id").map_err(corrupt)?;
    let status: String = row.try_get("status").map_err(corrupt)?;
    Ok(InstanceRow {
        status: parse_status(&id, &status)?,
        name: row.try_get("name").map_err(corrupt)?,
        generation: row.try_get("generation").map_err(corrupt)?,
        input: row.try_get("input").map_err(corrupt)?,
        first_input: row.try_get("first_input").map_err(corrupt)?,
        signature: row.try_get("signature").map_err(corrupt)?,
        output: row.try_get("output").map_err(corrupt)?,
        error: row.try_get("error").map_err(corrupt)?,
        attempts: row.try_get("attempts").map_err(corrupt)?,
        lease_owner: row.try_get("lease_owner").map_err(corrupt)?,
        lease_expires_at: row.try_get("lease_expires_at").map_err(corrupt)?,
        wake_at: row.try_get("wake_at").map_err(corrupt)?,
        parent_id: row.try_get("parent_id").map_err(corrupt)?,
        parent_seq: row.try_get("parent_seq").map_err(corrupt)?,
        created_at: row.try_get("created_at").map_err(corrupt)?,
        updated_at: row.try_get("updated_at").map_err(corrupt)?,
        id,
    })
}

fn step_from_row(row: &SqliteRow) -> Result<StepRow> {
    Ok(StepRow {
        workflow_id: row.try_get("workflow_id").map_err(corrupt)?,
        generation: row.try_get("generation").map_err(corrupt)?,
        seq: row.try_get("seq").map_err(corrupt)?,
        name: row.try_get("name").map_err(corrupt)?,
        kind: row.try_get("kind").map_err(corrupt)?,
        result: row.try_get("result").map_err(corrupt)?,
    })
}

/// SQLITE_BUSY / SQLITE_LOCKED: another connection holds the lock.
fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("5" | "6" | "261" | "517")))
}

/// A JSON object of signatures by name, for `json_each` (`key`, `value`).
fn workflows_json(workflows: &[Registered<'_>]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = workflows
        .iter()
        .map(|w| (w.name.to_owned(), w.signature.into()))
        .collect();
    serde_json::Value::Object(map).to_string()
}

fn corrupt(e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        what: format!("a column could not be read: {e}"),
    }
}

fn executor_from_row(row: &SqliteRow) -> Result<ExecutorRow> {
    Ok(ExecutorRow {
        id: row.try_get("id").map_err(corrupt)?,
        token: row.try_get("token").map_err(corrupt)?,
        host: row.try_get("host").map_err(corrupt)?,
        pid: row.try_get("pid").map_err(corrupt)?,
        heartbeat_at: row.try_get("heartbeat_at").map_err(corrupt)?,
    })
}
