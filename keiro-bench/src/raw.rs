//! `raw_commit_1` and `raw_commit_16`: the physical limit. A plain sqlx loop
//! inserting one journal-sized row per transaction into keiro's own steps
//! table, through a pool opened exactly as keiro opens it (SQLite: WAL, the
//! chosen `synchronous`, `BEGIN IMMEDIATE`, 4 connections; PostgreSQL: 8
//! connections, one autocommitted statement per row).

use std::time::Instant;

use keiro_store::Store;

use crate::common::{median, plain_store, round3, with_fresh_db, BenchResult, Config, Figure};

/// Commits measured by `raw_commit_1`.
const SERIAL_COMMITS: usize = 2_000;
/// Tasks of `raw_commit_16`.
const TASKS: usize = 16;
/// Commits per task in `raw_commit_16`.
const COMMITS_PER_TASK: usize = 250;
/// Unmeasured commits first, to warm the pool and the file.
const WARMUP: usize = 50;

/// The step result keiro journals for a no-op step returning a small number.
const RESULT: &str = "7";

/// Inserts and commits one steps row, the way keiro's writer does for a
/// lone step.
pub(crate) async fn commit_one(store: &Store, workflow_id: &str, seq: i64) -> BenchResult {
    let now = keiro_store::now_us();
    match store {
        Store::Sqlite(s) => {
            let mut tx = s.pool().begin_with("BEGIN IMMEDIATE").await?;
            sqlx::query(
                "INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, \
                 created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (workflow_id, generation, seq) DO NOTHING",
            )
            .bind(workflow_id)
            .bind(0_i64)
            .bind(seq)
            .bind("noop")
            .bind("step")
            .bind(RESULT)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
        }
        Store::Postgres(s) => {
            sqlx::query(
                "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, \
                 created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (workflow_id, generation, seq) DO NOTHING",
            )
            .bind(workflow_id)
            .bind(0_i64)
            .bind(seq)
            .bind("noop")
            .bind("step")
            .bind(RESULT)
            .bind(now)
            .execute(s.pool())
            .await?;
        }
    }
    Ok(())
}

/// Seconds for `n` commits of [`commit_one`] one after another, from one
/// task, under workflow id `id` from sequence number `from`: the reference
/// other workloads interleave with their own series.
pub(crate) async fn timed_commits(store: &Store, id: &str, from: i64, n: i64) -> BenchResult<f64> {
    let started = Instant::now();
    for seq in from..from + n {
        commit_one(store, id, seq).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Commits `n` rows one after another under a fresh workflow id, starting at
/// sequence number `from`.
async fn serial(store: &Store, workflow_id: &str, from: usize, n: usize) -> BenchResult {
    for seq in from..from + n {
        commit_one(store, workflow_id, seq as i64).await?;
    }
    Ok(())
}

/// `raw_commit_1`: microseconds per commit from one task.
pub(crate) async fn raw_commit_1(cfg: &Config) -> BenchResult {
    let us = with_fresh_db(cfg.backend, |db| async move {
        let store = plain_store(cfg, &db.url).await?;
        let id = uuid::Uuid::new_v4().to_string();
        serial(&store, &id, 0, WARMUP).await?;
        // Timed in ten rounds: the figure is the total, the median round
        // shows how much bursts of disk latency moved it.
        let per_round = SERIAL_COMMITS / 10;
        let mut rounds = Vec::with_capacity(10);
        let started = Instant::now();
        for round in 0..10 {
            let round_started = Instant::now();
            serial(&store, &id, WARMUP + round * per_round, per_round).await?;
            rounds.push(round_started.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / SERIAL_COMMITS as f64;
        store.close().await;
        Ok((us, median(&rounds)))
    })
    .await?;
    let (us, median_round) = us;
    cfg.emit(
        Figure::new("raw_commit_1", us, "us/commit")
            .with("commits", SERIAL_COMMITS)
            .with("median_round_us", round3(median_round)),
    );
    Ok(())
}

/// `raw_commit_16`: rows per second from 16 concurrent tasks.
pub(crate) async fn raw_commit_16(cfg: &Config) -> BenchResult {
    let rate = with_fresh_db(cfg.backend, |db| async move {
        let store = plain_store(cfg, &db.url).await?;
        serial(&store, &uuid::Uuid::new_v4().to_string(), 0, WARMUP).await?;
        let started = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let id = uuid::Uuid::new_v4().to_string();
                    serial(&store, &id, 0, COMMITS_PER_TASK).await
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        let rate = (TASKS * COMMITS_PER_TASK) as f64 / started.elapsed().as_secs_f64();
        store.close().await;
        Ok(rate)
    })
    .await?;
    cfg.emit(
        Figure::new("raw_commit_16", rate, "rows/s")
            .with("tasks", TASKS)
            .with("rows", TASKS * COMMITS_PER_TASK),
    );
    Ok(())
}
