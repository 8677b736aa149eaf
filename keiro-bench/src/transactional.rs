//! `transactional_step`: the cost of a `#[step(transaction)]` that makes one
//! application INSERT, its journal row riding in the same commit. Measured
//! like `select_overhead`: (time of workflows of ten such steps - time of
//! empty workflows) / steps, interleaved in rounds with as many commits of
//! `raw_commit_1` (one journal-sized row per transaction, from one task) on
//! the same database, and with workflows of ten plain no-op steps.

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

/// `transactional_step`: `us/step` for a step doing one application INSERT,
/// with `raw_commit_1` and a plain no-op step measured in the same run.
pub(crate) async fn transactional_step(cfg: &Config) -> BenchResult {
    let (t1, t1_tx, t_steps, t_tx, t_raw) = with_fresh_db(cfg.backend, |db| async move {
        let store = plain_store(cfg, &db.url).await?;
        create_table(&store).await?;
        let raw_id = uuid::Uuid::new_v4().to_string();
        timed_commits(&store, &raw_id, 0, 50).await?;
        let keiro = cfg.builder(&db.url).connect().await?;
        series(&keiro, "warm", 20, PER_WORKFLOW, true).await?;
        // Rounds interleave the series and the raw commits, so a burst of
        // disk latency weighs on all of them alike.
        let per_round = WORKFLOWS / ROUNDS;
        let raw_per_round = i64::from(per_round * PER_WORKFLOW);
        let (mut t1, mut t1_tx, mut t_steps, mut t_tx, mut t_raw) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for round in 0..ROUNDS {
            t1 += series(&keiro, &format!("e-{round}"), per_round, 1, false).await?;
            t1_tx += series(&keiro, &format!("f-{round}"), per_round, 1, true).await?;
            let tag = format!("s-{round}");
            t_steps += series(&keiro, &tag, per_round, PER_WORKFLOW, false).await?;
            let tag = format!("t-{round}");
            t_tx += series(&keiro, &tag, per_round, PER_WORKFLOW, true).await?;
            let from = 50 + i64::from(round) * raw_per_round;
            t_raw += timed_commits(&store, &raw_id, from, raw_per_round).await?;
        }
        keiro.store().close().await;
        store.close().await;
        Ok((t1, t1_tx, t_steps, t_tx, t_raw))
    })
    .await?;
    // Steps 2 to 10 of each workflow: its first step also records the
    // instance (see `sequential`).
    let steps = f64::from(WORKFLOWS * (PER_WORKFLOW - 1));
    let us_per_tx_step = (t_tx - t1_tx) * 1e6 / steps;
    let us_per_step = (t_steps - t1) * 1e6 / steps;
    let raw_us = t_raw * 1e6 / f64::from(WORKFLOWS * PER_WORKFLOW);
    cfg.emit(
        Figure::new("transactional_step", us_per_tx_step, "us/step")
            .with(
                "how",
                "(time of 200 wf x 10 transactional steps of one INSERT - time of 200 wf x 1 such step) / 1800",
            )
            .with("raw_commit_1_us_interleaved", round3(raw_us))
            .with("ratio_to_raw_commit_1", round3(us_per_tx_step / raw_us))
            .with("us_per_plain_step_interleaved", round3(us_per_step)),
    );
    Ok(())
}
