//! `transactional_step`: the cost of a `#[step(transaction)]` that makes one
//! application INSERT, its journal row riding in the same commit. Measured
//! like `select_overhead`: (time of workflows of ten such steps - time of
//! empty workflows) / steps, interleaved in rounds with as many commits of
//! `raw_commit_1` (one journal-sized row per transaction, from one task) on
//! the same database, with workflows of ten plain no-op steps, and with plain
//! sqlx transactions making the same two writes as the step (BEGIN, the
//! application's INSERT, the journal row, COMMIT) from a task on the runtime,
//! where a workflow's steps run too. `raw_commit_1` is also timed from such
//! a task: on SQLite every statement is a call to the connection's own
//! thread, and answering a task parked on the runtime costs more than
//! answering the bench's main task.

use std::time::Instant;

use keiro::{step, workflow, Keiro, Transaction};
use keiro_store::Store;

use crate::common::{fail, plain_store, round3, with_fresh_db, BenchResult, Config, Figure};
use crate::raw::timed_commits;
use crate::workflows::bench_steps;

/// Workflows per series.
const WORKFLOWS: u32 = 200;
/// Rounds the series are interleaved in.
const ROUNDS: u32 = 10;
/// Steps per workflow.
const PER_WORKFLOW: u32 = 10;

/// The application's table: one row per step.
const CREATE: &str = "CREATE TABLE bench_orders (id TEXT PRIMARY KEY, n BIGINT NOT NULL)";
/// The step's one application write.
const INSERT: &str = "INSERT INTO bench_orders (id, n) VALUES ($1, $2)";

/// Inserts one application row in keiro's transaction; returns `n`.
#[step(transaction)]
pub(crate) async fn insert_order(
    tx: &mut Transaction<'_>,
    id: String,
    n: u32,
) -> Result<u32, String> {
    let done = if let Some(tx) = tx.as_sqlite() {
        sqlx::query(INSERT)
            .bind(&id)
            .bind(i64::from(n))
            .execute(&mut **tx)
            .await
            .map(drop)
    } else if let Some(tx) = tx.as_postgres() {
        sqlx::query(INSERT)
            .bind(&id)
            .bind(i64::from(n))
            .execute(&mut **tx)
            .await
            .map(drop)
    } else {
        unreachable!("keiro runs on SQLite or PostgreSQL")
    };
    done.map(|()| n).map_err(|e| e.to_string())
}

/// `count` transactional steps one after another, each inserting
/// `{tag}-{n}`; returns the sum of `0..count`.
#[workflow(name = "bench_transactional_steps")]
pub(crate) async fn bench_transactional_steps(tag: String, count: u32) -> Result<u32, String> {
    let mut total = 0;
    for n in 0..count {
        total += insert_order(format!("{tag}-{n}"), n).await?;
    }
    Ok(total)
}

/// In transaction `$tx`, the application row and a journal row into
/// `$steps` for `$id` (`$i`, `$now`), then the commit. SQLite takes
/// PostgreSQL's `$N` placeholders too.
macro_rules! commit_same_writes {
    ($tx:ident, $steps:literal, $id:expr, $i:expr, $now:expr) => {{
        sqlx::query(INSERT)
            .bind($id)
            .bind(i64::from($i))
            .execute(&mut *$tx)
            .await?;
        sqlx::query(concat!(
            "INSERT INTO ",
            $steps,
            " (workflow_id, generation, seq, name, kind, result, created_at) \
             VALUES ($1, 0, $2, 'noop', 'step', '7', $3) \
             ON CONFLICT (workflow_id, generation, seq) DO NOTHING"
        ))
        .bind($id)
        .bind(i64::from($i))
        .bind($now)
        .execute(&mut *$tx)
        .await?;
        $tx.commit().await?;
    }};
}

/// Seconds for `n` plain sqlx transactions of the same two writes a
/// transactional step makes (one application row, one journal row), one
/// after another: what the application would pay doing them itself.
async fn timed_app_commits(store: &Store, tag: &str, n: u32) -> BenchResult<f64> {
    let started = Instant::now();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let now = keiro_store::now_us();
        match store {
            Store::Sqlite(s) => {
                let mut tx = s.pool().begin_with("BEGIN IMMEDIATE").await?;
                commit_same_writes!(tx, "keiro_steps", &id, i, now);
            }
            Store::Postgres(s) => {
                let mut tx = s.pool().begin().await?;
                commit_same_writes!(tx, "keiro.steps", &id, i, now);
            }
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Runs `n` workflows one after another, of `count` transactional steps
/// (`transactional`) or no-op steps; returns the seconds it took.
async fn series(
    keiro: &Keiro,
    tag: &str,
    n: u32,
    count: u32,
    transactional: bool,
) -> BenchResult<f64> {
    let expected: u32 = (0..count).sum();
    let started = Instant::now();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let out = if transactional {
            bench_transactional_steps(id.clone(), count)
                .id(id)
                .on(keiro)
                .await?
                .map_err(fail)?
        } else {
            bench_steps(count).id(id).on(keiro).await?
        };
        if out != expected {
            return Err(fail(format!("{tag}: {count} returned {out}")));
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Creates the application's table beside keiro's.
async fn create_table(store: &Store) -> BenchResult {
    match store {
        Store::Sqlite(s) => sqlx::query(CREATE).execute(s.pool()).await.map(drop)?,
        Store::Postgres(s) => sqlx::query(CREATE).execute(s.pool()).await.map(drop)?,
    }
    Ok(())
}

/// Seconds each series of `transactional_step` took, summed over rounds.
#[derive(Default)]
struct Times {
    /// Workflows of one plain step.
    one_plain: f64,
    /// Workflows of one transactional step.
    one_tx: f64,
    /// Workflows of ten plain steps.
    plain: f64,
    /// Workflows of ten transactional steps.
    tx: f64,
    /// `raw_commit_1` commits from the bench's main task.
    raw: f64,
    /// The same commits from a task on the runtime.
    raw_in_task: f64,
    /// Plain sqlx transactions of the step's two writes, from a task.
    same_writes_in_task: f64,
}

/// Runs `f` in a task on the runtime (where a workflow's steps run too),
/// returning its seconds.
async fn in_task<F>(f: F) -> BenchResult<f64>
where
    F: std::future::Future<Output = BenchResult<f64>> + Send + 'static,
{
    tokio::spawn(f).await.map_err(|e| fail(e.to_string()))?
}

/// `transactional_step`: `us/step` for a step doing one application INSERT,
/// with `raw_commit_1` and a plain no-op step measured in the same run.
pub(crate) async fn transactional_step(cfg: &Config) -> BenchResult {
    let t = with_fresh_db(cfg.backend, |db| async move {
        let store = plain_store(cfg, &db.url).await?;
        create_table(&store).await?;
        let raw_id = uuid::Uuid::new_v4().to_string();
        let task_id = uuid::Uuid::new_v4().to_string();
        timed_commits(&store, &raw_id, 0, 50).await?;
        let keiro = cfg.builder(&db.url).connect().await?;
        series(&keiro, "warm", 20, PER_WORKFLOW, true).await?;
        // Rounds interleave the series and the raw commits, so a burst of
        // disk latency weighs on all of them alike.
        let per_round = WORKFLOWS / ROUNDS;
        let raw_per_round = i64::from(per_round * PER_WORKFLOW);
        let mut t = Times::default();
        for round in 0..ROUNDS {
            t.one_plain += series(&keiro, &format!("e-{round}"), per_round, 1, false).await?;
            t.one_tx += series(&keiro, &format!("f-{round}"), per_round, 1, true).await?;
            let tag = format!("s-{round}");
            t.plain += series(&keiro, &tag, per_round, PER_WORKFLOW, false).await?;
            let tag = format!("t-{round}");
            t.tx += series(&keiro, &tag, per_round, PER_WORKFLOW, true).await?;
            let from = 50 + i64::from(round) * raw_per_round;
            t.raw += timed_commits(&store, &raw_id, from, raw_per_round).await?;
            let (s, id) = (store.clone(), task_id.clone());
            t.raw_in_task +=
                in_task(async move { timed_commits(&s, &id, from, raw_per_round).await }).await?;
            let (s, tag) = (store.clone(), format!("a-{round}"));
            let n = per_round * PER_WORKFLOW;
            t.same_writes_in_task +=
                in_task(async move { timed_app_commits(&s, &tag, n).await }).await?;
        }
        keiro.store().close().await;
        store.close().await;
        Ok(t)
    })
    .await?;
    // Steps 2 to 10 of each workflow: its first step also records the
    // instance (see `sequential`).
    let steps = f64::from(WORKFLOWS * (PER_WORKFLOW - 1));
    let us_per_tx_step = (t.tx - t.one_tx) * 1e6 / steps;
    let us_per_step = (t.plain - t.one_plain) * 1e6 / steps;
    let commits = f64::from(WORKFLOWS * PER_WORKFLOW);
    let raw_us = t.raw * 1e6 / commits;
    let raw_in_task_us = t.raw_in_task * 1e6 / commits;
    let same_writes_us = t.same_writes_in_task * 1e6 / commits;
    cfg.emit(
        Figure::new("transactional_step", us_per_tx_step, "us/step")
            .with(
                "how",
                "(time of 200 wf x 10 transactional steps of one INSERT - time of 200 wf x 1 such step) / 1800",
            )
            .with("raw_commit_1_us_interleaved", round3(raw_us))
            .with("ratio_to_raw_commit_1", round3(us_per_tx_step / raw_us))
            .with("raw_commit_1_in_a_task_us_interleaved", round3(raw_in_task_us))
            .with(
                "ratio_to_raw_commit_1_in_a_task",
                round3(us_per_tx_step / raw_in_task_us),
            )
            .with("us_per_plain_step_interleaved", round3(us_per_step))
            .with("plain_sqlx_same_writes_in_a_task_us_interleaved", round3(same_writes_us))
            .with(
                "ratio_to_plain_sqlx_same_writes_in_a_task",
                round3(us_per_tx_step / same_writes_us),
            ),
    );
    Ok(())
}
