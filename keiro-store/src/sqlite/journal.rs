//! The journal writes SQLite does its own way: instances created one
//! statement pair at a time under the write lock, steps appended with
//! multi-row `VALUES` lists.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use sqlx::SqliteConnection;

use super::{SqliteStore, SQL};
use crate::journal::{get_step_on, new_instance_args, step_args, unreadable_step};
use crate::rows::FromRow;
use crate::sql::STEP_COLUMNS;
use crate::{
    rows, AppendOutcome, InstanceRow, NewInstance, Result, StepRow, StepTiming, StoreError,
};

/// Rows per multi-row insert (9 parameters each, well under SQLite's limit).
const APPEND_CHUNK: usize = 256;

/// The multi-row step insert for each batch size, built the first time a
/// batch of that size comes.
static INSERT_STEPS: [OnceLock<String>; APPEND_CHUNK] = [const { OnceLock::new() }; APPEND_CHUNK];

/// The statement inserting `rows` steps (1 ..= [`APPEND_CHUNK`]) and
/// returning the step ids it inserted.
fn insert_steps(rows: usize) -> &'static str {
    INSERT_STEPS[rows - 1].get_or_init(|| {
        let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows].join(", ");
        format!(
            "INSERT INTO keiro_steps ({STEP_COLUMNS}, created_at, attempts, started_at) \
             VALUES {values} \
             ON CONFLICT (workflow_id, generation, seq) DO NOTHING \
             RETURNING workflow_id, generation, seq"
        )
    })
}

impl SqliteStore {
    pub(crate) async fn append_steps(
        &self,
        rows: &[StepRow],
        timings: &[StepTiming],
    ) -> Result<Vec<AppendOutcome>> {
        const OP: &str = "append_steps";
        let now = self.clock.now_us();
        let mut tx = self.begin(OP).await?;
        // Multi-row inserts: a statement costs a round trip to SQLite's
        // thread, so a batch pays one per chunk instead of one per row.
        let mut inserted: HashSet<(String, i64, i64)> = HashSet::with_capacity(rows.len());
        for (c, chunk) in rows.chunks(APPEND_CHUNK).enumerate() {
            let mut query = sqlx::query(insert_steps(chunk.len()));
            for (i, step) in chunk.iter().enumerate() {
                let timing = StepTiming::of(timings, c * APPEND_CHUNK + i);
                query = bind_all!(query, &step_args(step, now))
                    .bind(timing.attempts_column())
                    .bind(timing.started_at);
            }
            for row in query
                .fetch_all(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
            {
                inserted.insert(rows::step_key(&row)?);
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
                let (id, generation, seq) = owned;
                let existing = get_step_on((&mut *tx).into(), OP, &id, generation, seq)
                    .await?
                    .ok_or_else(|| unreadable_step(step))?;
                AppendOutcome::Existing(existing)
            };
            first.insert(key, outcome.clone());
            outcomes.push(outcome);
        }
        tx.commit().await.map_err(StoreError::query(OP))?;
        Ok(outcomes)
    }
}

impl SqliteStore {
    /// Records a new instance, or reads the existing one with its id.
    pub(crate) async fn create_on(
        &self,
        conn: &mut SqliteConnection,
        new: &NewInstance<'_>,
        now: i64,
    ) -> Result<(InstanceRow, bool)> {
        create_on(conn, new, now).await
    }
}

/// Records a new instance on `conn`, or reads the existing one with its id.
pub(crate) async fn create_on(
    conn: &mut SqliteConnection,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)> {
    const OP: &str = "create_instance";
    let inserted = bind_all!(
        sqlx::query(&SQL.insert_instance),
        &new_instance_args(new, now)
    )
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query(OP))?
    .rows_affected()
        == 1;
    let row = sqlx::query(&SQL.get_instance)
        .bind(new.id)
        .fetch_one(&mut *conn)
        .await
        .map_err(StoreError::query(OP))?;
    Ok((InstanceRow::from_row(&row)?, inserted))
}
