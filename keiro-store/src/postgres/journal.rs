//! The journal writes PostgreSQL does its own way: an instance created with
//! an insert-or-read in one statement, steps appended from arrays with
//! `UNNEST`.

use std::collections::HashMap;
use std::sync::LazyLock;

use sqlx::postgres::PgConnection;

use super::{PostgresStore, SQL};
use crate::journal::{new_instance_args, unreadable_step};
use crate::query::Session;
use crate::rows::{FromRow, StoreRow};
use crate::sql::{INSTANCE_COLUMNS, STEP_COLUMNS};
use crate::{
    rows, AppendOutcome, Finish, InstanceRow, NewInstance, Result, StepRow, StepTiming, StoreError,
};

/// How often `append_steps` retries rows that conflicted but could not be read
/// back (removed by a concurrent writer in between) before giving up.
const APPEND_ATTEMPTS: usize = 3;

/// The insert of a batch of steps from eight parallel arrays (ids,
/// generations, seqs, names, kinds, results, attempts, first starts) at
/// `$first` to `$first + 7`, written at `$now`, in batch order, for the rows
/// `filter` (a `WHERE` clause, or nothing) lets through.
fn insert_steps_sql(first: usize, now: usize, filter: &str) -> String {
    let [ids, generations, seqs, names, kinds, results, attempts, started] =
        std::array::from_fn::<usize, 8, _>(|i| first + i);
    format!(
        "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, \
         result, created_at, attempts, started_at) \
         SELECT workflow_id, generation, seq, name, kind, result, ${now}, attempts, started_at \
         FROM UNNEST(${ids}::text[], ${generations}::int8[], ${seqs}::int8[], \
         ${names}::text[], ${kinds}::text[], ${results}::text[], ${attempts}::int8[], \
         ${started}::int8[]) \
         WITH ORDINALITY AS t(workflow_id, generation, seq, name, kind, result, attempts, \
         started_at, ord) \
         {filter} ORDER BY ord"
    )
}

/// Inserts a batch of steps ([`insert_steps_sql`], the arrays at `$1` to
/// `$8`, written at `$9`), keeping any step id already journaled; returns
/// the step ids it inserted.
static INSERT_STEPS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} ON CONFLICT (workflow_id, generation, seq) DO NOTHING \
         RETURNING workflow_id, generation, seq",
        insert_steps_sql(1, 9, "")
    )
});

/// Inserts a batch of steps ([`insert_steps_sql`], the arrays at `$1` to
/// `$8`, written at `$9`) all or nothing: a step id journaled already fails
/// the whole statement (`23505`).
static INSERT_ALL_STEPS: LazyLock<String> = LazyLock::new(|| insert_steps_sql(1, 9, ""));

/// The lone finish of an instance without a parent (`finish_alone`, `$1` to
/// `$7`) with its run's last steps (the arrays at `$8` to `$15`, written at
/// its time) in one statement: the rows are inserted only if the end
/// applied, and a step id journaled already fails the whole statement
/// (`23505`), so it writes all or nothing.
static FINISH_ALONE_AFTER_STEPS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH finished AS ({} RETURNING 1) {}",
        SQL.finish_alone,
        insert_steps_sql(8, 7, "WHERE EXISTS (SELECT 1 FROM finished)")
    )
});

/// Inserts a batch of new instances given as parallel arrays, each as the
/// one-instance insert does (`$15` now; a child inherits its parent's
/// deadline when that comes first), keeping any id already there. Returns
/// the rows it inserted.
static CREATE_MANY: LazyLock<String> = LazyLock::new(|| create_many_sql(false));

/// [`CREATE_MANY`] for instances enqueued on named queues: five more arrays
/// (`$16` queue, `$17` priority, `$18` partition key, `$19` not before,
/// `$20` creation time) set each inserted row's place in line in the insert
/// itself, where marking
/// them afterwards took a second statement, whose join on the ids a
/// generic plan made while the table was small ran as a scan of the whole
/// table.
static CREATE_MANY_QUEUED: LazyLock<String> = LazyLock::new(|| create_many_sql(true));

/// The text of [`CREATE_MANY`] (`queued`: of [`CREATE_MANY_QUEUED`]).
fn create_many_sql(queued: bool) -> String {
    let parent_deadline = "(SELECT p.deadline FROM keiro.workflows p WHERE p.id = t.parent_id)";
    let (columns, values, wake_at, created_at, arrays, names) = match queued {
        true => (
            ", queue, priority, partition_key",
            ", t.queue, t.priority, t.partition_key",
            "COALESCE(t.not_before, t.lease_expires_at, $15)",
            "t.created_at",
            ", $16::text[], $17::int8[], $18::text[], $19::int8[], $20::int8[]",
            ", queue, priority, partition_key, not_before, created_at",
        ),
        false => ("", "", "COALESCE(t.lease_expires_at, $15)", "$15", "", ""),
    };
    format!(
        "INSERT INTO keiro.workflows (id, name, generation, status, input, attempts, \
             lease_owner, lease_expires_at, wake_at, parent_id, parent_seq, parent_generation, \
             created_at, updated_at, signature, deadline, traceparent, app_version, \
             skeleton_hash{columns}) \
         SELECT t.id, t.name, 0, t.status, t.input, 0, t.lease_owner, t.lease_expires_at, \
             {wake_at}, t.parent_id, t.parent_seq, \
             t.parent_generation, {created_at}, $15, t.signature, \
             CASE WHEN {parent_deadline} IS NOT NULL \
                 AND (t.deadline IS NULL OR {parent_deadline} < t.deadline) \
                 THEN {parent_deadline} ELSE t.deadline END, \
             t.traceparent, t.app_version, t.skeleton_hash{values} \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
             $6::int8[], $7::text[], $8::int8[], $9::int8[], $10::text[], $11::int8[], \
             $12::text[], $13::text[], $14::text[]{arrays}) \
         WITH ORDINALITY AS t(id, name, status, input, lease_owner, lease_expires_at, \
             parent_id, parent_seq, parent_generation, signature, deadline, traceparent, \
             app_version, skeleton_hash{names}, ord) \
         ORDER BY t.ord \
         ON CONFLICT (id) DO NOTHING \
         RETURNING {INSTANCE_COLUMNS}"
    )
}

/// Reads the instances whose ids are in the array `$1`.
static READ_INSTANCES: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {INSTANCE_COLUMNS} FROM keiro.workflows WHERE id = ANY($1::text[])")
});

/// Finishes a batch of instances given as parallel arrays (id, generation,
/// lease owner, status, output, error; `$7` now): each applies only while
/// unfinished and unleased (no queue slot's hold either) or leased by its
/// owner, like the one-instance finish. Returns the batch position (from 1)
/// of each that applied, and whether it has a parent to report to.
const FINISH_MANY: &str = "UPDATE keiro.workflows w SET status = f.status, output = f.output, \
     error = f.error, lease_owner = NULL, lease_expires_at = NULL, wake_at = NULL, \
     updated_at = $7 \
     FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[]) \
     WITH ORDINALITY AS f(id, generation, owner, status, output, error, ord) \
     WHERE w.id = f.id AND w.generation = f.generation \
     AND w.status IN ('pending', 'running', 'suspended') \
     AND (w.lease_owner = f.owner \
         OR (w.lease_owner IS NULL AND w.lease_expires_at IS NULL)) \
     RETURNING f.ord, w.parent_id IS NOT NULL AS has_parent, w.partition_key";

/// Reads back the recorded steps of the step ids given as parallel arrays.
static READ_BACK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {STEP_COLUMNS} FROM keiro.steps \
         JOIN UNNEST($1::text[], $2::int8[], $3::int8[]) AS k(workflow_id, generation, seq) \
         USING (workflow_id, generation, seq)"
    )
});

/// Insert-or-read in one statement. When a concurrent transaction inserts the
/// same id, `ON CONFLICT` waits for it to commit, but this statement's
/// snapshot predates that row, so neither branch returns it and a plain read
/// (a new snapshot) picks it up.
static CREATE_INSTANCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH inserted AS ({} RETURNING {INSTANCE_COLUMNS}) \
         SELECT {INSTANCE_COLUMNS}, TRUE AS created FROM inserted \
         UNION ALL \
         SELECT {INSTANCE_COLUMNS}, FALSE AS created FROM keiro.workflows \
         WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM inserted)",
        SQL.insert_instance
    )
});

impl PostgresStore {
    /// Records several new instances with one statement for them all (then
    /// reads the ones whose ids were taken already with one more), each
    /// outcome as `Store::create_instances` gives it, in batch order. Of two
    /// creates of one id in the batch, the first creates it.
    pub(crate) async fn create_many(
        &self,
        news: &[NewInstance<'_>],
        now: i64,
    ) -> Result<Vec<(InstanceRow, bool)>> {
        const OP: &str = "create_instance";
        let mut conn = self.acquire(OP).await?;
        let created = create_many_on(&mut conn, news, now).await?;
        conn.done(OP).await?;
        Ok(created)
    }

    /// Finishes several instances (distinct ids) in the transaction `tx` with
    /// one statement for them all, then reports each child among them to its
    /// parent in the same transaction: what `Store::finish_many` does with a
    /// statement per instance. In batch order, the partition key of each
    /// that applied (the queue's hand-over starts its successor there), and
    /// `None` for each that did not.
    pub(crate) async fn finish_many_on(
        tx: &mut PgConnection,
        finishes: &[crate::Finish<'_>],
        now: i64,
    ) -> Result<Vec<Option<String>>> {
        const OP: &str = "finish";
        let rows = crate::prepared::query(FINISH_MANY)
            .bind(finishes.iter().map(|f| f.id).collect::<Vec<_>>())
            .bind(finishes.iter().map(|f| f.generation).collect::<Vec<_>>())
            .bind(finishes.iter().map(|f| f.owner).collect::<Vec<_>>())
            .bind(
                finishes
                    .iter()
                    .map(|f| f.status.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(finishes.iter().map(|f| f.output).collect::<Vec<_>>())
            .bind(finishes.iter().map(|f| f.error).collect::<Vec<_>>())
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?;
        let mut applied = vec![None; finishes.len()];
        for row in &rows {
            let what = || "a finished instance".to_owned();
            let ord = row.int(what, "ord")?;
            let Some(at) = usize::try_from(ord)
                .ok()
                .and_then(|ord| ord.checked_sub(1))
                .filter(|at| *at < finishes.len())
            else {
                return Err(StoreError::Corrupt {
                    what: format!("a batch finish returned position {ord}"),
                });
            };
            applied[at] = Some(row.text(what, "partition_key")?);
            if row.flag(what, "has_parent")? {
                crate::journal::report_to_parent((&mut *tx).into(), finishes[at].id, now).await?;
            }
        }
        Ok(applied)
    }

    /// Records the whole batch with one multi-row `INSERT .. ON CONFLICT DO
    /// NOTHING` (a single statement, hence one transaction and one round
    /// trip), then reads back only the step ids that were already recorded.
    ///
    /// The read-back may run after the insert committed because a recorded
    /// step is never overwritten: the row it finds is the first result.
    pub(crate) async fn append_steps(
        &self,
        rows: &[StepRow],
        timings: &[StepTiming],
    ) -> Result<Vec<AppendOutcome>> {
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
        let now = self.clock.now_us();
        for _ in 0..APPEND_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            // Every writer inserts in step-id order, so two batches that
            // overlap wait on each other in one direction and never deadlock.
            pending.sort_unstable_by_key(|&i| key(&rows[i]));
            let batch: Vec<&StepRow> = pending.iter().map(|&i| &rows[i]).collect();
            let timed: Vec<(&StepRow, StepTiming)> = pending
                .iter()
                .map(|&i| (&rows[i], StepTiming::of(timings, i)))
                .collect();
            for (workflow_id, generation, seq) in
                insert_steps_on(self.exec(), "append_steps", &timed, now).await?
            {
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

            let (ids, generations, seqs) = step_ids(&conflicting);
            let existing = crate::prepared::query(&READ_BACK)
                .bind(ids)
                .bind(generations)
                .bind(seqs)
                .fetch_all(self.exec())
                .await
                .map_err(StoreError::query("append_steps"))?;
            for row in &existing {
                let step = StepRow::from_row(row)?;
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
            return Err(unreadable_step(&rows[i]));
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
}

/// Inserts `batch` (each row with how its body ran) on `exec` with one
/// multi-row statement, in batch order, keeping any step id already
/// journaled; returns the step ids it inserted.
pub(crate) async fn insert_steps_on<'e>(
    exec: impl sqlx::PgExecutor<'e>,
    op: &'static str,
    batch: &[(&StepRow, StepTiming)],
    now: i64,
) -> Result<Vec<(String, i64, i64)>> {
    let inserted = bind_steps(crate::prepared::query(&INSERT_STEPS), batch)
        .bind(now)
        .fetch_all(exec)
        .await
        .map_err(StoreError::query(op))?;
    inserted.iter().map(rows::step_key).collect()
}

/// `query` with `batch` bound as the eight arrays [`insert_steps_sql`]
/// reads, in its order.
fn bind_steps<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    batch: &[(&'q StepRow, StepTiming)],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let rows: Vec<&'q StepRow> = batch.iter().map(|(row, _)| *row).collect();
    let (ids, generations, seqs) = step_ids(&rows);
    query
        .bind(ids)
        .bind(generations)
        .bind(seqs)
        .bind(rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.result.as_str()).collect::<Vec<_>>())
        .bind(
            batch
                .iter()
                .map(|(_, timing)| timing.attempts_column())
                .collect::<Vec<_>>(),
        )
        .bind(
            batch
                .iter()
                .map(|(_, timing)| timing.started_at)
                .collect::<Vec<_>>(),
        )
}

impl PostgresStore {
    /// Chains of step rows (`batch`, in step-id order) in one statement that
    /// commits on its own ([`INSERT_ALL_STEPS`]): whether they were all
    /// recorded. When a step id was journaled already it wrote nothing, and
    /// the caller writes the chains in a transaction instead, which stops
    /// each at its first such row.
    pub(crate) async fn append_all_steps(
        &self,
        batch: &[(&StepRow, StepTiming)],
        now: i64,
    ) -> Result<bool> {
        let query = bind_steps(crate::prepared::query(&INSERT_ALL_STEPS), batch).bind(now);
        match query.execute(self.exec()).await {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
            Err(error) => Err(StoreError::query("append_chains")(error)),
        }
    }

    /// The lone finish of an instance without a parent with its run's last
    /// steps, in one statement that commits on its own
    /// ([`FINISH_ALONE_AFTER_STEPS`]): whether the end applied. When it did
    /// not (a step id was journaled already, the lease is another's, the
    /// instance has a parent) it wrote nothing, and the caller finds out
    /// why in a transaction.
    pub(crate) async fn finish_alone_after_steps(
        &self,
        finish: &Finish<'_>,
        batch: &[(&StepRow, StepTiming)],
        now: i64,
    ) -> Result<bool> {
        let query = bind_all!(
            crate::prepared::query(&FINISH_ALONE_AFTER_STEPS),
            &crate::journal::finish_args(finish, now)
        );
        match bind_steps(query, batch).execute(self.exec()).await {
            // Rows inserted: the end applied (none else are).
            Ok(done) => Ok(done.rows_affected() > 0),
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
            Err(error) => Err(StoreError::query("finish")(error)),
        }
    }
}

/// The step ids of `rows` as three parallel arrays, for `UNNEST`.
fn step_ids<'a>(rows: &[&'a StepRow]) -> (Vec<&'a str>, Vec<i64>, Vec<i64>) {
    let ids = rows.iter().map(|r| r.workflow_id.as_str()).collect();
    let generations = rows.iter().map(|r| r.generation).collect();
    let seqs = rows.iter().map(|r| r.seq).collect();
    (ids, generations, seqs)
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

impl PostgresStore {
    /// Records a new instance, or reads the existing one with its id.
    pub(crate) async fn create_on(
        &self,
        conn: &mut PgConnection,
        new: &NewInstance<'_>,
        now: i64,
    ) -> Result<(InstanceRow, bool)> {
        create_on(conn, new, now).await
    }
}

/// Records several new instances on `conn` with one statement for them all
/// (then reads the ones whose ids were taken already with one more), each
/// outcome as `Store::create_instances` gives it, in batch order. Of two
/// creates of one id in the batch, the first creates it.
pub(crate) async fn create_many_on<'a>(
    conn: &mut PgConnection,
    news: &[NewInstance<'a>],
    now: i64,
) -> Result<Vec<(InstanceRow, bool)>> {
    create_placed_on(conn, news, None, now).await
}

/// [`create_many_on`] for instances enqueued on named queues, each inserted
/// row placed in line as `queued` (same position) says: its queue,
/// priority, partition and not-before time, but not its dedup key, which
/// the caller takes afterwards in key order; created at `stamps` (same
/// position).
pub(crate) async fn create_many_queued_on<'a>(
    conn: &mut PgConnection,
    news: &[NewInstance<'a>],
    queued: &[&crate::Queued<'a>],
    stamps: &[i64],
    now: i64,
) -> Result<Vec<(InstanceRow, bool)>> {
    debug_assert_eq!(
        (queued.len(), stamps.len()),
        (news.len(), news.len()),
        "one place on a queue and one creation time per instance"
    );
    create_placed_on(conn, news, Some((queued, stamps)), now).await
}

/// [`create_many_on`], with each inserted row placed in line and created
/// at the time `queued` (same position) says when it is given.
async fn create_placed_on<'a>(
    conn: &mut PgConnection,
    news: &[NewInstance<'a>],
    queued: Option<(&[&crate::Queued<'a>], &[i64])>,
    now: i64,
) -> Result<Vec<(InstanceRow, bool)>> {
    const OP: &str = "create_instance";
    let column = |pick: fn(&NewInstance<'a>) -> Option<&'a str>| -> Vec<Option<&'a str>> {
        news.iter().map(pick).collect()
    };
    let leases: Vec<(&str, Option<&str>, Option<i64>)> = news
        .iter()
        .map(|n| match n.lease {
            Some(lease) => ("running", Some(lease.owner), Some(now + lease.ttl_us)),
            None => ("pending", None, None),
        })
        .collect();
    let statement = match queued {
        Some(_) => &*CREATE_MANY_QUEUED,
        None => &*CREATE_MANY,
    };
    let mut query = crate::prepared::query(statement)
        .bind(news.iter().map(|n| n.id).collect::<Vec<_>>())
        .bind(news.iter().map(|n| n.name).collect::<Vec<_>>())
        .bind(leases.iter().map(|l| l.0).collect::<Vec<_>>())
        .bind(news.iter().map(|n| n.input).collect::<Vec<_>>())
        .bind(leases.iter().map(|l| l.1).collect::<Vec<_>>())
        .bind(leases.iter().map(|l| l.2).collect::<Vec<_>>())
        .bind(column(|n| n.parent.map(|p| p.id)))
        .bind(
            news.iter()
                .map(|n| n.parent.map(|p| p.seq))
                .collect::<Vec<_>>(),
        )
        .bind(
            news.iter()
                .map(|n| n.parent.map(|p| p.generation))
                .collect::<Vec<_>>(),
        )
        .bind(column(|n| n.signature))
        .bind(news.iter().map(|n| n.deadline).collect::<Vec<_>>())
        .bind(column(|n| n.traceparent))
        .bind(column(|n| n.app_version))
        .bind(column(|n| n.skeleton_hash))
        .bind(now);
    if let Some((queued, stamps)) = queued {
        query = query
            .bind(queued.iter().map(|q| q.queue).collect::<Vec<_>>())
            .bind(queued.iter().map(|q| q.priority).collect::<Vec<_>>())
            .bind(queued.iter().map(|q| q.partition).collect::<Vec<_>>())
            .bind(queued.iter().map(|q| q.not_before).collect::<Vec<_>>())
            .bind(stamps);
    }
    let inserted = query
        .fetch_all(&mut *conn)
        .await
        .map_err(StoreError::query(OP))?;
    let mut rows: HashMap<String, (InstanceRow, bool)> = HashMap::with_capacity(news.len());
    for row in &inserted {
        let row = InstanceRow::from_row(row)?;
        rows.insert(row.id.clone(), (row, true));
    }
    let missing: Vec<&str> = news
        .iter()
        .map(|n| n.id)
        .filter(|id| !rows.contains_key(*id))
        .collect();
    if !missing.is_empty() {
        // A new statement, so a new snapshot: it sees the rows whose
        // concurrent insert the conflict above waited for.
        let existing = crate::prepared::query(&READ_INSTANCES)
            .bind(&missing)
            .fetch_all(&mut *conn)
            .await
            .map_err(StoreError::query(OP))?;
        for row in &existing {
            let row = InstanceRow::from_row(row)?;
            rows.insert(row.id.clone(), (row, false));
        }
    }
    crate::journal::in_batch_order(news, rows)
}

/// Records a new instance on `conn` (insert-or-read in one statement), or
/// reads the existing one with its id.
pub(crate) async fn create_on(
    conn: &mut PgConnection,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)> {
    const OP: &str = "create_instance";
    let row = bind_all!(
        crate::prepared::query(&CREATE_INSTANCE),
        &new_instance_args(new, now)
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query(OP))?;
    if let Some(row) = row {
        let what = || format!("workflow instance `{}`", new.id);
        let created = row.flag(what, "created")?;
        return Ok((InstanceRow::from_row(&row)?, created));
    }
    let existing = crate::prepared::query(&SQL.get_instance)
        .bind(new.id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::query(OP))?;
    match existing.as_ref().map(InstanceRow::from_row).transpose()? {
        Some(existing) => Ok((existing, false)),
        None => Err(StoreError::Corrupt {
            what: format!(
                "workflow instance `{}` conflicted on insert but cannot be read",
                new.id
            ),
        }),
    }
}
