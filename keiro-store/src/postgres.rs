//! The PostgreSQL backend: many processes, one `keiro` schema.
//!
//! Every statement is written so that concurrent processes sharing the
//! database stay correct: conflicts are resolved by primary keys and
//! `ON CONFLICT DO NOTHING`, and lease checks sit in the `WHERE` clause of the
//! `UPDATE` that takes the lease, which PostgreSQL re-evaluates on the locked
//! row when two claims race.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Row};

use crate::error::redact;
use crate::types::parse_status;
use crate::{
    now_ms, AppendOutcome, Cancellation, Finish, InstanceRow, InstanceStatus, Lease, NewInstance,
    Registered, Resolution, Result, StepRow, StoreError, StoreOptions,
};

/// The PostgreSQL migrations, embedded at build time.
///
/// [`PostgresStore::connect`] runs them with `search_path` set to `keiro`, so
/// sqlx's bookkeeping table is `keiro._sqlx_migrations` and never collides
/// with an application's own sqlx migrations in the same database.
pub static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// How long connecting (and acquiring a pooled connection) may take before
/// the store reports the server as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The session advisory lock (`"keiro"` in ASCII) that serialises creating
/// the `keiro` schema across processes starting at the same time.
const SCHEMA_LOCK: i64 = 0x6b_6569_726f;

const INSTANCE_COLUMNS: &str = "id, name, generation, status, input, first_input, signature, \
     output, error, attempts, lease_owner, lease_expires_at, wake_at, parent_id, parent_seq, \
     created_at, updated_at";

const STEP_COLUMNS: &str = "workflow_id, generation, seq, name, kind, result";

/// How often `append_steps` retries rows that conflicted but could not be read
/// back (removed by a concurrent writer in between) before giving up.
const APPEND_ATTEMPTS: usize = 3;

/// The PostgreSQL journal store.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to the PostgreSQL database at `url` and migrates it.
    ///
    /// Concurrent processes may connect and migrate at the same time: the
    /// migrations run under advisory locks.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<PostgresStore> {
        let connect = PgConnectOptions::from_str(url).map_err(|e| StoreError::InvalidUrl {
            url: redact(url),
            reason: e.to_string(),
        })?;
        let connect_error = |source: sqlx::Error| StoreError::Connect {
            url: redact(url),
            source: Arc::new(source),
        };

        // One direct connection first: the pool retries a refused connection
        // until its timeout and then reports only `PoolTimedOut`, while this
        // reports why the server cannot be reached, at once.
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&connect))
            .await
            .map_err(|_| {
                connect_error(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                )))
            })?
            .map_err(connect_error)?;
        migrate(&mut conn).await.map_err(|e| StoreError::Migrate {
            backend: "postgres",
            source: Arc::new(e),
        })?;
        // The session (and its advisory locks) ends here; an error closing it
        // changes nothing for the store.
        let _ = conn.close().await;

        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.unwrap_or(8))
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(connect)
            .await
            .map_err(connect_error)?;
        Ok(PostgresStore { pool })
    }

    /// The underlying pool, for tests and benchmarks.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) async fn create_instance(
        &self,
        new: &NewInstance<'_>,
    ) -> Result<(InstanceRow, bool)> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(StoreError::query("create_instance"))?;
        create_on(&mut conn, new, now_ms()).await
    }

    pub(crate) async fn create_instances(
        &self,
        news: &[NewInstance<'_>],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        if let [one] = news {
            return Ok(vec![self.create_instance(one).await?]);
        }
        let now = now_ms();
        let mut tx = self
            .pool
            .begin()
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
            "SELECT {INSTANCE_COLUMNS} FROM keiro.workflows WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(StoreError::query("get_instance"))?;
        row.as_ref().map(instance_from_row).transpose()
    }

    pub(crate) async fn claim(&self, id: &str, lease: Lease<'_>) -> Result<Option<InstanceRow>> {
        let now = now_ms();
        // Two racing claims: the second blocks on the row lock, then
        // PostgreSQL re-checks the WHERE clause against the first claim's
        // committed row and finds a live foreign lease.
        let row = sqlx::query(&format!(
            "UPDATE keiro.workflows SET lease_owner = $2, lease_expires_at = $3, wake_at = $3, \
             status = 'running', updated_at = $4 \
             WHERE id = $1 AND status IN ('pending', 'running', 'suspended') \
             AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < $4) \
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
            "UPDATE keiro.workflows SET lease_expires_at = $3, wake_at = $3 \
             WHERE id = $1 AND lease_owner = $2 AND status IN ('pending', 'running', 'suspended')",
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
            "UPDATE keiro.workflows SET lease_owner = NULL, lease_expires_at = NULL, \
             wake_at = CASE WHEN status IN ('pending', 'running', 'suspended') THEN $3 \
             ELSE NULL END, updated_at = $3 WHERE id = $1 AND lease_owner = $2",
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
        let rows = sqlx::query(&format!(
            "SELECT {STEP_COLUMNS} FROM keiro.steps \
             WHERE workflow_id = $1 AND generation = $2 ORDER BY seq"
        ))
        .bind(id)
        .bind(generation)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("load_journal"))?;
        rows.iter().map(step_from_row).collect()
    }

    /// Records the whole batch with one multi-row `INSERT .. ON CONFLICT DO
    /// NOTHING` (a single statement, hence one transaction and one round
    /// trip), then reads back only the step ids that were already recorded.
    ///
    /// The read-back may run after the insert committed because a recorded
    /// step is never overwritten: the row it finds is the first result.
    pub(crate) async fn append_steps(&self, rows: &[StepRow]) -> Result<Vec<AppendOutcome>> {
        // The first occurrence of each step id in the batch speaks for it;
        // later duplicates resolve to whatever the first one resolves to.
        let mut first_of: HashMap<StepKey<'_>, usize> = HashMap::with_capacity(rows.len());
        let mut pending: Vec<usize> = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            first_of.entry(key(row)).or_insert_with(|| {
                pending.push(i);
                i
            });
        }

        let mut resolved: HashMap<StepKey<'_>, AppendOutcome> = HashMap::with_capacity(rows.len());
        let now = now_ms();
        for _ in 0..APPEND_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            // Every writer inserts in step-id order, so two batches that
            // overlap wait on each other in one direction and never deadlock.
            pending.sort_unstable_by_key(|&i| key(&rows[i]));
            let batch: Vec<&StepRow> = pending.iter().map(|&i| &rows[i]).collect();
            let inserted = sqlx::query(
                "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, \
                 created_at) \
                 SELECT workflow_id, generation, seq, name, kind, result, $7 \
                 FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::text[], $5::text[], \
                 $6::text[]) WITH ORDINALITY \
                 AS t(workflow_id, generation, seq, name, kind, result, ord) \
                 ORDER BY ord \
                 ON CONFLICT (workflow_id, generation, seq) DO NOTHING \
                 RETURNING workflow_id, generation, seq",
            )
            .bind(
                batch
                    .iter()
                    .map(|r| r.workflow_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(batch.iter().map(|r| r.generation).collect::<Vec<_>>())
            .bind(batch.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(batch.iter().map(|r| r.name.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|r| r.result.as_str()).collect::<Vec<_>>())
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::query("append_steps"))?;
            for row in &inserted {
                let what = || "a step this batch inserted".to_owned();
                let workflow_id: String = row
                    .try_get("workflow_id")
                    .map_err(|e| corrupt(what(), "workflow_id", e))?;
                let generation: i64 = row
                    .try_get("generation")
                    .map_err(|e| corrupt(what(), "generation", e))?;
                let seq: i64 = row.try_get("seq").map_err(|e| corrupt(what(), "seq", e))?;
                let i = batch_index(&first_of, (workflow_id.as_str(), generation, seq))?;
                resolved.insert(key(&rows[i]), AppendOutcome::Inserted);
            }
            let conflicting: Vec<&StepRow> = batch
                .into_iter()
                .filter(|row| !resolved.contains_key(&key(row)))
                .collect();
            pending.clear();
            if conflicting.is_empty() {
                break;
            }

            let existing = sqlx::query(&format!(
                "SELECT {STEP_COLUMNS} FROM keiro.steps \
                 JOIN UNNEST($1::text[], $2::int8[], $3::int8[]) AS k(workflow_id, generation, seq) \
                 USING (workflow_id, generation, seq)"
            ))
            .bind(
                conflicting
                    .iter()
                    .map(|r| r.workflow_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(conflicting.iter().map(|r| r.generation).collect::<Vec<_>>())
            .bind(conflicting.iter().map(|r| r.seq).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::query("append_steps"))?;
            for row in &existing {
                let step = step_from_row(row)?;
                let i = batch_index(&first_of, key(&step))?;
                resolved.insert(key(&rows[i]), AppendOutcome::Existing(step));
            }
            // A conflicting row that is gone by now was removed between the
            // insert and the read-back: insert it again.
            pending.extend(
                conflicting
                    .into_iter()
                    .filter(|row| !resolved.contains_key(&key(row)))
                    .map(|row| first_of[&key(row)]),
            );
        }
        if let Some(&i) = pending.first() {
            let row = &rows[i];
            return Err(StoreError::Corrupt {
                what: format!(
                    "step {} of workflow instance `{}` (generation {}) keeps conflicting on \
                     insert but cannot be read back",
                    row.seq, row.workflow_id, row.generation
                ),
            });
        }

        Ok(rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let k = key(row);
                let first = first_of[&k];
                match &resolved[&k] {
                    AppendOutcome::Inserted if i != first => {
                        AppendOutcome::Existing(rows[first].clone())
                    }
                    outcome => outcome.clone(),
                }
            })
            .collect())
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
            .begin()
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
            "UPDATE keiro.workflows SET status = 'suspended', lease_owner = NULL, \
             lease_expires_at = NULL, updated_at = $5, \
             wake_at = CASE WHEN $6::int8 IS NOT NULL AND EXISTS (SELECT 1 FROM keiro.steps \
                 WHERE workflow_id = $1 AND generation = $2 AND seq = $6) THEN $5 ELSE $4 END \
             WHERE id = $1 AND generation = $2 AND lease_owner = $3 AND status = 'running'",
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
            "SELECT workflow_id, generation, seq, name, kind, result FROM keiro.steps \
             WHERE workflow_id = $1 AND generation = $2 AND seq = $3",
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
            .begin()
            .await
            .map_err(StoreError::query("resolve"))?;
        let exists = sqlx::query(
            "SELECT 1 FROM keiro.steps WHERE workflow_id = $1 AND generation = $2 AND seq = $3 \
             AND kind = $4",
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
            "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
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
                "SELECT workflow_id, generation, seq, name, kind, result FROM keiro.steps \
                 WHERE workflow_id = $1 AND generation = $2 AND seq = $3",
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
            "UPDATE keiro.workflows SET wake_at = $3, updated_at = $3 \
             WHERE id = $1 AND generation = $2 AND status = 'suspended'",
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
            .begin()
            .await
            .map_err(StoreError::query("cancel"))?;
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM keiro.workflows WHERE id = $1 FOR UPDATE")
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
                 SELECT $1::text \
                 UNION SELECT w.id FROM keiro.workflows w JOIN tree ON w.parent_id = tree.id \
             ) \
             SELECT w.id FROM keiro.workflows w JOIN tree ON w.id = tree.id \
             WHERE w.status IN ('pending', 'running', 'suspended')",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::query("cancel"))?;
        for cancelled in &ids {
            sqlx::query(
                "UPDATE keiro.workflows SET status = 'cancelled', error = 'cancelled', \
                 lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL, updated_at = $2 \
                 WHERE id = $1",
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
            "SELECT count(*) FROM keiro.steps a JOIN keiro.workflows w \
             ON w.id = a.workflow_id AND w.generation = a.generation \
             WHERE a.kind = 'awakeable' AND w.status IN ('pending', 'running', 'suspended') \
             AND NOT EXISTS (SELECT 1 FROM keiro.steps r WHERE r.workflow_id = a.workflow_id \
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
            "UPDATE keiro.workflows SET generation = generation + 1, input = $4, \
             first_input = COALESCE(first_input, input), \
             status = 'pending', attempts = 0, error = NULL, output = NULL, lease_owner = NULL, \
             lease_expires_at = NULL, wake_at = $5, updated_at = $5 \
             WHERE id = $1 AND generation = $2 AND lease_owner = $3 AND status = 'running'",
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

    pub(crate) async fn find_due(&self, limit: i64) -> Result<Vec<InstanceRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {INSTANCE_COLUMNS} FROM keiro.workflows \
             WHERE status IN ('pending', 'running', 'suspended') AND wake_at <= $1 \
             ORDER BY wake_at LIMIT $2"
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
        let (names, signatures) = split(workflows);
        let now = now_ms();
        let returning: Vec<String> = INSTANCE_COLUMNS
            .split(',')
            .map(|c| format!("w.{}", c.trim()))
            .collect();
        // SKIP LOCKED: workers claiming at once take disjoint batches. The
        // name test keeps the plain filter; the signature test is a hashed
        // lookup of the (name, signature) pairs, still one statement.
        let rows = sqlx::query(&format!(
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
        ))
        .bind(lease.owner)
        .bind(now + lease.ttl_ms)
        .bind(now)
        .bind(names)
        .bind(limit)
        .bind(signatures)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("claim_due"))?;
        rows.iter().map(instance_from_row).collect()
    }

    pub(crate) async fn requeue_set_aside(&self, id: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE keiro.workflows SET status = 'pending', error = NULL, wake_at = $2, \
             updated_at = $2 WHERE id = $1 AND status = 'nondeterministic'",
        )
        .bind(id)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("requeue_set_aside"))?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}

/// Creates the `keiro` schema and runs [`POSTGRES_MIGRATOR`] with sqlx's
/// bookkeeping table inside it.
async fn migrate(conn: &mut PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    // `CREATE SCHEMA IF NOT EXISTS` is not safe against a concurrent creator
    // (it can fail on the catalog's unique index), hence the lock.
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut *conn)
        .await?;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS keiro")
        .execute(&mut *conn)
        .await?;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut *conn)
        .await?;
    // Only this short-lived session sees the changed search path.
    sqlx::query("SET search_path TO keiro")
        .execute(&mut *conn)
        .await?;
    POSTGRES_MIGRATOR.run_direct(conn).await
}

/// The names and signatures of `workflows` as two parallel arrays, for `UNNEST`.
pub(crate) fn split<'a>(workflows: &[Registered<'a>]) -> (Vec<&'a str>, Vec<&'a str>) {
    workflows.iter().map(|w| (w.name, w.signature)).unzip()
}

type StepKey<'a> = (&'a str, i64, i64);

fn key(row: &StepRow) -> StepKey<'_> {
    (row.workflow_id.as_str(), row.generation, row.seq)
}

/// Where in the batch the step id the database answered with first occurs.
fn batch_index(first_of: &HashMap<StepKey<'_>, usize>, (w, g, s): StepKey<'_>) -> Result<usize> {
    first_of
        .get(&(w, g, s))
        .copied()
        .ok_or_else(|| StoreError::Corrupt {
            what: format!(
                "the database answered with step {s} of workflow instance `{w}` (generation {g}), \
             which the batch does not hold"
            ),
        })
}

/// Records a child's end in its parent's journal (the step the parent awaits)
/// and makes a suspended parent due; nothing for an instance without a parent.
async fn create_on(
    conn: &mut PgConnection,
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
    // Insert-or-read in one statement. When a concurrent transaction
    // inserts the same id, `ON CONFLICT` waits for it to commit, but this
    // statement's snapshot predates that row, so neither branch returns it
    // and the plain read below (a new snapshot) picks it up.
    let row = sqlx::query(&format!(
        "WITH inserted AS ( \
             INSERT INTO keiro.workflows (id, name, generation, status, input, attempts, \
             lease_owner, lease_expires_at, wake_at, parent_id, parent_seq, \
             parent_generation, created_at, updated_at, signature) \
             VALUES ($1, $2, 0, $3, $4, 0, $5, $6, COALESCE($6, $9), $7, $8, $10, $9, $9, $11) \
             ON CONFLICT (id) DO NOTHING \
             RETURNING {INSTANCE_COLUMNS} \
         ) \
         SELECT {INSTANCE_COLUMNS}, TRUE AS created FROM inserted \
         UNION ALL \
         SELECT {INSTANCE_COLUMNS}, FALSE AS created FROM keiro.workflows \
         WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM inserted)"
    ))
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
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query("create_instance"))?;
    if let Some(row) = row {
        let created: bool = row
            .try_get("created")
            .map_err(|e| corrupt(format!("workflow instance `{}`", new.id), "created", e))?;
        return Ok((instance_from_row(&row)?, created));
    }
    let existing = sqlx::query(&format!(
        "SELECT {INSTANCE_COLUMNS} FROM keiro.workflows WHERE id = $1"
    ))
    .bind(new.id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query("create_instance"))?;
    match existing.as_ref().map(instance_from_row).transpose()? {
        Some(existing) => Ok((existing, false)),
        None => Err(StoreError::Corrupt {
            what: format!(
                "workflow instance `{}` conflicted on insert but cannot be read",
                new.id
            ),
        }),
    }
}

/// Moves an unfinished instance to a final status and reports to its parent.
async fn finish_on(conn: &mut PgConnection, finish: &Finish<'_>, now: i64) -> Result<bool> {
    let updated: Option<bool> = sqlx::query_scalar(
        "UPDATE keiro.workflows SET status = $4, output = $5, error = $6, \
         lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL, updated_at = $7 \
         WHERE id = $1 AND generation = $2 \
         AND status IN ('pending', 'running', 'suspended') \
         AND (lease_owner IS NULL OR lease_owner = $3) \
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

pub(crate) async fn report_to_parent(conn: &mut PgConnection, child: &str, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, created_at) \
         SELECT parent_id, parent_generation, parent_seq, name, 'child', \
             CASE WHEN output IS NOT NULL AND status IN ('completed', 'failed') \
                  THEN '{\"Ok\":' || output || '}' \
                  ELSE json_build_object('Err', json_build_object('status', status, \
                      'message', COALESCE(error, '')))::text END, \
             $2 \
         FROM keiro.workflows WHERE id = $1 AND parent_id IS NOT NULL \
         AND status <> 'nondeterministic' \
         ON CONFLICT (workflow_id, generation, seq) DO NOTHING",
    )
    .bind(child)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("report_to_parent"))?;
    sqlx::query(
        "UPDATE keiro.workflows SET wake_at = $2, updated_at = $2 WHERE status = 'suspended' \
         AND id = (SELECT parent_id FROM keiro.workflows WHERE id = $1)",
    )
    .bind(child)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("report_to_parent"))?;
    Ok(())
}

fn instance_from_row(row: &PgRow) -> Result<InstanceRow> {
    let id: String = row
        .try_get("id")
        .map_err(|e| corrupt("a workflow instance".into(), "id", e))?;
    let what = || format!("workflow instance `{id}`");
    let get = |column: &'static str| move |e| corrupt(what(), column, e);
    let status: String = row.try_get("status").map_err(get("status"))?;
    Ok(InstanceRow {
        status: parse_status(&id, &status)?,
        name: row.try_get("name").map_err(get("name"))?,
        generation: row.try_get("generation").map_err(get("generation"))?,
        input: row.try_get("input").map_err(get("input"))?,
        first_input: row.try_get("first_input").map_err(get("first_input"))?,
        signature: row.try_get("signature").map_err(get("signature"))?,
        output: row.try_get("output").map_err(get("output"))?,
        error: row.try_get("error").map_err(get("error"))?,
        attempts: row.try_get("attempts").map_err(get("attempts"))?,
        lease_owner: row.try_get("lease_owner").map_err(get("lease_owner"))?,
        lease_expires_at: row
            .try_get("lease_expires_at")
            .map_err(get("lease_expires_at"))?,
        wake_at: row.try_get("wake_at").map_err(get("wake_at"))?,
        parent_id: row.try_get("parent_id").map_err(get("parent_id"))?,
        parent_seq: row.try_get("parent_seq").map_err(get("parent_seq"))?,
        created_at: row.try_get("created_at").map_err(get("created_at"))?,
        updated_at: row.try_get("updated_at").map_err(get("updated_at"))?,
        id,
    })
}

fn step_from_row(row: &PgRow) -> Result<StepRow> {
    let workflow_id: String = row
        .try_get("workflow_id")
        .map_err(|e| corrupt("a step".into(), "workflow_id", e))?;
    let generation: i64 = row.try_get("generation").map_err(|e| {
        corrupt(
            format!("a step of workflow instance `{workflow_id}`"),
            "generation",
            e,
        )
    })?;
    let seq: i64 = row.try_get("seq").map_err(|e| {
        corrupt(
            format!("a step of workflow instance `{workflow_id}` (generation {generation})"),
            "seq",
            e,
        )
    })?;
    let what =
        || format!("step {seq} of workflow instance `{workflow_id}` (generation {generation})");
    let get = |column: &'static str| move |e| corrupt(what(), column, e);
    Ok(StepRow {
        name: row.try_get("name").map_err(get("name"))?,
        kind: row.try_get("kind").map_err(get("kind"))?,
        result: row.try_get("result").map_err(get("result"))?,
        workflow_id,
        generation,
        seq,
    })
}

fn corrupt(what: String, column: &str, e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        what: format!("{what}: column `{column}` could not be read: {e}"),
    }
}
