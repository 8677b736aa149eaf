//! The journal writes SQLite does its own way: instances created one
//! statement pair at a time under the write lock, steps appended with
//! multi-row `VALUES` lists.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use sqlx::SqliteConnection;

use super::{SqliteStore, SQL};
use crate::journal::{journaled_on, new_instance_args, step_args};
use crate::rows::FromRow;
use crate::rows::StoreRow;
use crate::sql::{INSTANCE_COLUMNS, STEP_COLUMNS};
use crate::{
    rows, AppendOutcome, Finish, InstanceRow, NewInstance, Result, StepRow, StepTiming, StoreError,
};

/// Rows per multi-row insert (9 parameters each, well under SQLite's limit).
const APPEND_CHUNK: usize = 256;

/// The multi-row step insert for each batch size, built the first time a
/// batch of that size comes.
static INSERT_STEPS: [OnceLock<String>; APPEND_CHUNK] = [const { OnceLock::new() }; APPEND_CHUNK];

/// The statement inserting `rows` steps (2 ..= [`APPEND_CHUNK`]) and
/// returning the step ids it inserted.
fn insert_steps(rows: usize) -> &'static str {
    INSERT_STEPS[rows - 1].get_or_init(|| {
        format!(
            "{} RETURNING workflow_id, generation, seq",
            insert_steps_sql(rows)
        )
    })
}

/// The insert of one step row, without `RETURNING` (see
/// [`insert_steps_on`]).
fn insert_step() -> &'static str {
    static INSERT_STEP: OnceLock<String> = OnceLock::new();
    INSERT_STEP.get_or_init(|| insert_steps_sql(1))
}

/// The insert of `rows` step rows, keeping a step id already journaled.
fn insert_steps_sql(rows: usize) -> String {
    let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows].join(", ");
    format!(
        "INSERT INTO keiro_steps ({STEP_COLUMNS}, created_at, attempts, started_at) \
         VALUES {values} \
         ON CONFLICT (workflow_id, generation, seq) DO NOTHING"
    )
}

/// Inserts `batch` (each row with how its body ran) on `conn` (a
/// transaction, or for one statement's worth the connection alone) with
/// multi-row statements (a statement costs a round trip to SQLite's
/// thread, so a batch pays one per chunk instead of one per row), keeping
/// any step id already journaled; returns the step ids it inserted.
pub(crate) async fn insert_steps_on(
    conn: &mut SqliteConnection,
    op: &'static str,
    batch: &[(&StepRow, StepTiming)],
    now: i64,
) -> Result<HashSet<(String, i64, i64)>> {
    let mut inserted = HashSet::with_capacity(batch.len());
    for chunk in batch.chunks(APPEND_CHUNK) {
        if let [(step, timing)] = chunk {
            // One row: one answer from the connection's thread (a stream of
            // rows sends the row and its end apart), and the statement runs
            // to its end, where SQLite commits it outside a transaction.
            let done = bind_all!(crate::prepared::query(insert_step()), &step_args(step, now))
                .bind(timing.attempts_column())
                .bind(timing.started_at)
                .execute(&mut *conn)
                .await
                .map_err(StoreError::query(op))?;
            if done.rows_affected() == 1 {
                inserted.insert((step.workflow_id.clone(), step.generation, step.seq));
            }
            continue;
        }
        let mut query = crate::prepared::query(insert_steps(chunk.len()));
        for (step, timing) in chunk {
            query = bind_all!(query, &step_args(step, now))
                .bind(timing.attempts_column())
                .bind(timing.started_at);
        }
        for row in query
            .fetch_all(&mut *conn)
            .await
            .map_err(StoreError::query(op))?
        {
            inserted.insert(rows::step_key(&row)?);
        }
    }
    Ok(inserted)
}

impl SqliteStore {
    /// Appends `rows` (each with its timing), keeping a step id journaled
    /// before: a batch of up to [`APPEND_CHUNK`] rows is one multi-row
    /// statement that commits on its own (one call to the connection's
    /// thread instead of a transaction's three; SQLite takes the write lock
    /// as the statement starts, its busy handler waiting for it like `BEGIN
    /// IMMEDIATE`'s, and a statement commits whole or not at all), a larger
    /// one a transaction of such statements. The recorded row of each step
    /// id taken before is read after.
    pub(crate) async fn append_steps(
        &self,
        rows: &[StepRow],
        timings: &[StepTiming],
    ) -> Result<Vec<AppendOutcome>> {
        const OP: &str = "append_steps";
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock.now_us();
        let timed: Vec<(&StepRow, StepTiming)> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| (row, StepTiming::of(timings, i)))
            .collect();
        if rows.len() <= APPEND_CHUNK {
            // The turn first: a connection held while waiting for it would
            // be one fewer for the writer holding it.
            let turn = self.write_turn().await;
            let mut conn = self.acquire(OP).await?;
            let inserted = insert_steps_on(&mut conn, OP, &timed, now).await?;
            drop(turn);
            return appended(&mut conn, rows, &inserted).await;
        }
        let mut tx = self.begin(OP).await?;
        let inserted = insert_steps_on(&mut tx, OP, &timed, now).await?;
        let outcomes = appended(&mut tx, rows, &inserted).await?;
        tx.commit().await.map_err(StoreError::query(OP))?;
        Ok(outcomes)
    }
}

/// Each of `rows`' outcome, given the step ids the insert `inserted`: the
/// first row of a step id in the batch speaks for it, and a step id
/// recorded before the batch keeps its first result, read on `conn`.
async fn appended(
    conn: &mut SqliteConnection,
    rows: &[StepRow],
    inserted: &HashSet<(String, i64, i64)>,
) -> Result<Vec<AppendOutcome>> {
    const OP: &str = "append_steps";
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
            AppendOutcome::Existing(journaled_on((&mut *conn).into(), OP, step).await?)
        };
        first.insert(key, outcome.clone());
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Records a new instance on `conn`, or reads the existing one with its id.
pub(crate) async fn create_on(
    conn: &mut SqliteConnection,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)> {
    const OP: &str = "create_instance";
    let inserted = bind_all!(
        crate::prepared::query(&SQL.insert_instance),
        &new_instance_args(new, now)
    )
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query(OP))?
    .rows_affected()
        == 1;
    let row = crate::prepared::query(&SQL.get_instance)
        .bind(new.id)
        .fetch_one(&mut *conn)
        .await
        .map_err(StoreError::query(OP))?;
    Ok((InstanceRow::from_row(&row)?, inserted))
}

/// Rows per multi-row instance insert or finish (15 and 6 parameters a row,
/// well under SQLite's limit).
const INSTANCE_CHUNK: usize = 64;

/// The multi-row instance insert for each batch size.
static CREATE_MANY: [OnceLock<String>; INSTANCE_CHUNK] =
    [const { OnceLock::new() }; INSTANCE_CHUNK];

/// The multi-row finish for each batch size.
static FINISH_MANY: [OnceLock<String>; INSTANCE_CHUNK] =
    [const { OnceLock::new() }; INSTANCE_CHUNK];

/// `rows` rows of `width` anonymous placeholders: `(?, ?), (?, ?)`.
///
/// Anonymous, not numbered: SQLite resolves a numbered placeholder by
/// walking the list of every placeholder, when the statement is prepared
/// and again each time a value is bound to it, so a batch of numbered
/// placeholders costs time in the square of its size.
pub(crate) fn anonymous_rows(width: usize, rows: usize) -> String {
    let tuple = format!("({})", vec!["?"; width].join(", "));
    vec![tuple; rows].join(", ")
}

/// `tuple` (the one-instance insert's values, with `$1` .. `$n`
/// placeholders) with each `$k` read from column `k` of the row source
/// `v`, a `VALUES` list.
fn from_values_columns(tuple: &str) -> String {
    let mut out = String::with_capacity(tuple.len() * 2);
    let mut rest = tuple;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        out.push_str("v.column");
        out.push_str(&rest[at + 1..at + 1 + digits]);
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// The statement inserting `rows` new instances (1 ..= [`INSTANCE_CHUNK`]),
/// each as the one-instance insert does, keeping ids already there, and
/// returning the rows it inserted.
fn create_many(rows: usize) -> &'static str {
    CREATE_MANY[rows - 1].get_or_init(|| {
        let one = &SQL.insert_instance;
        let (head, tail) = one.split_once(" VALUES ").expect("an INSERT .. VALUES");
        let (tuple, _) = tail
            .split_once(" ON CONFLICT")
            .expect("an INSERT .. ON CONFLICT");
        let tuple = tuple
            .trim()
            .strip_prefix('(')
            .and_then(|t| t.strip_suffix(')'))
            .expect("a parenthesised VALUES tuple");
        // Each row's fifteen values once, in order; the expressions of the
        // one-instance insert read them by column. (`WHERE true` tells
        // SQLite's parser the `ON CONFLICT` is the upsert's, not a join's.)
        format!(
            "{head} SELECT {} FROM (VALUES {}) AS v WHERE true \
             ON CONFLICT (id) DO NOTHING RETURNING {INSTANCE_COLUMNS}",
            from_values_columns(tuple),
            anonymous_rows(15, rows)
        )
    })
}

/// The statement finishing `rows` instances (1 ..= [`INSTANCE_CHUNK`]), each
/// as the one-instance finish does: six parameters a row (id, generation,
/// owner, status, output, error), then now. Returns the id of each that
/// applied and whether it has a parent.
fn finish_many(rows: usize) -> &'static str {
    FINISH_MANY[rows - 1].get_or_init(|| finish_many_sql(rows, ""))
}

/// The multi-row finish of instances without a parent, for each batch size.
static FINISH_MANY_ALONE: [OnceLock<String>; INSTANCE_CHUNK] =
    [const { OnceLock::new() }; INSTANCE_CHUNK];

/// [`finish_many`] applying only to instances without a parent: what
/// [`SqliteStore::finish_many_alone`] runs.
fn finish_many_alone(rows: usize) -> &'static str {
    FINISH_MANY_ALONE[rows - 1]
        .get_or_init(|| finish_many_sql(rows, " AND keiro_workflows.parent_id IS NULL"))
}

/// `sql`, a multi-row finish of `chunk.len()` instances, with `chunk` and
/// `now` bound.
fn finish_chunk<'q>(
    sql: &'q str,
    chunk: &[Finish<'q>],
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    let mut query = crate::prepared::query(sql);
    for finish in chunk {
        query = query
            .bind(finish.id)
            .bind(finish.generation)
            .bind(finish.owner)
            .bind(finish.status.as_str())
            .bind(finish.output)
            .bind(finish.error);
    }
    query.bind(now)
}

/// The multi-row finish of `rows` instances, with `and` added to its
/// condition.
fn finish_many_sql(rows: usize, and: &str) -> String {
    format!(
        "WITH f(id, generation, owner, status, output, error) AS (VALUES {}) \
         UPDATE keiro_workflows SET status = f.status, output = f.output, \
             error = f.error, lease_owner = NULL, lease_expires_at = NULL, \
             wake_at = NULL, updated_at = ? \
         FROM f WHERE keiro_workflows.id = f.id \
             AND keiro_workflows.generation = f.generation \
             AND keiro_workflows.status IN ('pending', 'running', 'suspended') \
             AND (keiro_workflows.lease_owner = f.owner \
                 OR (keiro_workflows.lease_owner IS NULL \
                     AND keiro_workflows.lease_expires_at IS NULL)){and} \
         RETURNING id, parent_id IS NOT NULL AS has_parent, partition_key",
        anonymous_rows(6, rows)
    )
}

impl SqliteStore {
    /// Finishes those of `finishes` (of distinct instances) that apply and
    /// have no parent, with one multi-row statement per chunk that commits
    /// on its own (one call to the connection's thread, where a
    /// transaction takes three); returns, in batch order, which applied.
    /// The others (a child, whose parent hears of its end in the same
    /// transaction, or one that does not apply at all) are left as they
    /// were: the caller finishes them in a transaction, which finds out why.
    pub(crate) async fn finish_many_alone(
        &self,
        finishes: &[Finish<'_>],
        now: i64,
    ) -> Result<Vec<bool>> {
        const OP: &str = "finish";
        let mut applied: HashSet<String> = HashSet::with_capacity(finishes.len());
        let turn = self.write_turn().await;
        let mut conn = self.acquire(OP).await?;
        for chunk in finishes.chunks(INSTANCE_CHUNK) {
            let rows = finish_chunk(finish_many_alone(chunk.len()), chunk, now)
                .fetch_all(&mut *conn)
                .await
                .map_err(StoreError::query(OP))?;
            for row in &rows {
                applied.insert(row.text(|| "a finished instance".to_owned(), "id")?);
            }
        }
        drop(turn);
        Ok(finishes.iter().map(|f| applied.contains(f.id)).collect())
    }
}

/// Records several new instances on `tx` (a write transaction) with one
/// insert per [`INSTANCE_CHUNK`] of them (and one read of the ids taken
/// already), each outcome as one create gives it, in batch order. Of two
/// creates of one id in the batch, the first creates it.
pub(crate) async fn create_many_on(
    tx: &mut SqliteConnection,
    news: &[NewInstance<'_>],
    now: i64,
) -> Result<Vec<(InstanceRow, bool)>> {
    const OP: &str = "create_instance";
    let mut rows: HashMap<String, (InstanceRow, bool)> = HashMap::with_capacity(news.len());
    for chunk in news.chunks(INSTANCE_CHUNK) {
        let mut query = crate::prepared::query(create_many(chunk.len()));
        for new in chunk {
            query = bind_all!(query, &new_instance_args(new, now));
        }
        for row in query
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?
        {
            let row = InstanceRow::from_row(&row)?;
            rows.insert(row.id.clone(), (row, true));
        }
    }
    let missing: Vec<&str> = news
        .iter()
        .map(|new| new.id)
        .filter(|id| !rows.contains_key(*id))
        .collect();
    if !missing.is_empty() {
        let ids = serde_json::to_string(&missing).map_err(|e| StoreError::Corrupt {
            what: format!("instance ids that do not encode as JSON: {e}"),
        })?;
        for row in crate::prepared::query(read_instances())
            .bind(ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?
        {
            let row = InstanceRow::from_row(&row)?;
            rows.insert(row.id.clone(), (row, false));
        }
    }
    crate::journal::in_batch_order(news, rows)
}

/// The read of the instances whose ids are in the JSON array `$1`.
fn read_instances() -> &'static str {
    static READ: OnceLock<String> = OnceLock::new();
    READ.get_or_init(|| {
        format!(
            "SELECT {INSTANCE_COLUMNS} FROM keiro_workflows \
             WHERE id IN (SELECT value FROM json_each($1))"
        )
    })
}

/// Finishes several instances (distinct ids) on `tx` (a write transaction)
/// with one statement per [`INSTANCE_CHUNK`] of them, and reports each
/// child among them to its parent. In batch order, the partition key of each
/// that applied (the queue's hand-over starts its successor there), and
/// `None` for each that did not.
pub(crate) async fn finish_many_on(
    tx: &mut SqliteConnection,
    finishes: &[Finish<'_>],
    now: i64,
) -> Result<Vec<Option<String>>> {
    const OP: &str = "finish";
    let mut applied: HashMap<String, (bool, String)> = HashMap::with_capacity(finishes.len());
    for chunk in finishes.chunks(INSTANCE_CHUNK) {
        let rows = finish_chunk(finish_many(chunk.len()), chunk, now)
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?;
        for row in &rows {
            let what = || "a finished instance".to_owned();
            applied.insert(
                row.text(what, "id")?,
                (
                    row.flag(what, "has_parent")?,
                    row.text(what, "partition_key")?,
                ),
            );
        }
    }
    let mut outcomes = Vec::with_capacity(finishes.len());
    for finish in finishes {
        let finished = applied.remove(finish.id);
        if let Some((true, _)) = finished {
            crate::journal::report_to_parent((&mut *tx).into(), finish.id, now).await?;
        }
        outcomes.push(finished.map(|(_, partition)| partition));
    }
    Ok(outcomes)
}
