//! The journal writes PostgreSQL does its own way: an instance created with
//! an insert-or-read in one statement, steps appended from arrays with
//! `UNNEST`.

use std::collections::HashMap;
use std::sync::LazyLock;

use sqlx::postgres::PgConnection;

use super::{PostgresStore, SQL};
use crate::journal::{new_instance_args, unreadable_step};
use crate::rows::{FromRow, StoreRow};
use crate::sql::{INSTANCE_COLUMNS, STEP_COLUMNS};
use crate::{
    rows, AppendOutcome, InstanceRow, NewInstance, Result, StepRow, StepTiming, StoreError,
};

/// How often `append_steps` retries rows that conflicted but could not be read
/// back (removed by a concurrent writer in between) before giving up.
const APPEND_ATTEMPTS: usize = 3;

/// Inserts a batch of steps from parallel arrays, in batch order, returning
/// the step ids it inserted.
const INSERT_STEPS: &str = "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, \
     result, created_at, attempts, started_at) \
     SELECT workflow_id, generation, seq, name, kind, result, $7, attempts, started_at \
     FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::text[], $5::text[], $6::text[], \
     $8::int8[], $9::int8[]) \
     WITH ORDINALITY AS t(workflow_id, generation, seq, name, kind, result, attempts, \
     started_at, ord) \
     ORDER BY ord \
     ON CONFLICT (workflow_id, generation, seq) DO NOTHING \
     RETURNING workflow_id, generation, seq";

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
            let (ids, generations, seqs) = step_ids(&batch);
            let inserted = sqlx::query(INSERT_STEPS)
                .bind(ids)
                .bind(generations)
                .bind(seqs)
                .bind(batch.iter().map(|r| r.name.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|r| r.result.as_str()).collect::<Vec<_>>())
                .bind(now)
                .bind(
                    pending
                        .iter()
                        .map(|&i| StepTiming::of(timings, i).attempts_column())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| StepTiming::of(timings, i).started_at)
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&self.pool)
                .await
                .map_err(StoreError::query("append_steps"))?;
            for row in &inserted {
                let (workflow_id, generation, seq) = rows::step_key(row)?;
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
            let existing = sqlx::query(&READ_BACK)
                .bind(ids)
                .bind(generations)
                .bind(seqs)
                .fetch_all(&self.pool)
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

/// Records a new instance on `conn` (insert-or-read in one statement), or
/// reads the existing one with its id.
pub(crate) async fn create_on(
    conn: &mut PgConnection,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)> {
    const OP: &str = "create_instance";
    let row = bind_all!(sqlx::query(&CREATE_INSTANCE), &new_instance_args(new, now))
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::query(OP))?;
    if let Some(row) = row {
        let what = || format!("workflow instance `{}`", new.id);
        let created = row.flag(what, "created")?;
        return Ok((InstanceRow::from_row(&row)?, created));
    }
    let existing = sqlx::query(&SQL.get_instance)
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
