//! `seq_0steps`, `seq_10steps`, `seq_10steps_pipelined` and
//! `concurrent_3steps`: workflows of no-op steps run in this process, one
//! after another or 64 at a time.

use std::time::Instant;

use futures::StreamExt;
use keiro::{Journal, Keiro};

use crate::common::{
    count, fail, process_cpu_seconds, round3, tables, with_fresh_db, BenchResult, Config, Figure,
};
use crate::raw::timed_commits;
use crate::workflows::{bench_steps, bench_steps_pipelined};

/// Workflows per sequential series.
const SEQ_WORKFLOWS: u32 = 500;
/// Rounds the sequential series are interleaved in.
const SEQ_ROUNDS: u32 = 10;
/// Workflows of `concurrent_3steps`.
const CONCURRENT_WORKFLOWS: u32 = 2_000;
/// At most this many of them in flight.
const IN_FLIGHT: usize = 64;
/// Unmeasured workflows first, to warm the pool and the file.
const WARMUP: u32 = 20;

/// Runs `n` workflows of `steps` no-op steps one after another; returns the
/// seconds it took.
async fn series(keiro: &Keiro, tag: &str, n: u32, steps: u32) -> BenchResult<f64> {
    series_journaled(keiro, tag, n, steps, Journal::Strict).await
}

/// [`series`] of workflows journaling as `journal` says.
async fn series_journaled(
    keiro: &Keiro,
    tag: &str,
    n: u32,
    steps: u32,
    journal: Journal,
) -> BenchResult<f64> {
    let expected: u32 = (0..steps).sum();
    let started = Instant::now();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let out = match journal {
            Journal::Strict => bench_steps(steps).id(id).on(keiro).await?,
            Journal::Pipelined => bench_steps_pipelined(steps).id(id).on(keiro).await?,
        };
        if out != expected {
            return Err(fail(format!("bench_steps({steps}) returned {out}")));
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds for `n` plain commits (`raw_commit_1`'s loop, on `keiro`'s pool
/// and table) of rows `from..from + n` under id `raw_id`.
async fn plain_commits(keiro: &Keiro, raw_id: &str, from: u32, n: u32) -> BenchResult<f64> {
    let store = keiro::unstable::raw_store(keiro);
    timed_commits(store, raw_id, i64::from(from), i64::from(n)).await
}

/// The sequential workloads. The 0-, 1- and 10-step series all run,
/// interleaved in rounds so that drift in the disk's commit latency hits them
/// alike; each round also times plain commits (`raw_commit_1`'s loop, same
/// pool and table) as an interleaved reference. `us/step` is the cost of
/// steps 2 to 10: `(t10 - t1) / 9` per workflow. (Against the 0-step series
/// it would also count the instance's create, which an awaited workflow
/// without steps records with its end and one with steps before its first
/// step.) `emit_0` and `emit_10` choose what is printed.
pub(crate) async fn sequential(cfg: &Config, emit_0: bool, emit_10: bool) -> BenchResult {
    let (t0, t1, t10, t_raw, step_cpu) = with_fresh_db(cfg.backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        series(&keiro, "warm", WARMUP, 10).await?;
        let raw_id = uuid::Uuid::new_v4().to_string();
        let per_round = SEQ_WORKFLOWS / SEQ_ROUNDS;
        let (mut t0, mut t1, mut t10, mut t_raw) = (0.0, 0.0, 0.0, 0.0);
        let (mut cpu1, mut cpu10) = (0.0, 0.0);
        for round in 0..SEQ_ROUNDS {
            t_raw += plain_commits(&keiro, &raw_id, round * per_round, per_round).await?;
            t0 += series(&keiro, &format!("s0-{round}"), per_round, 0).await?;
            let cpu = process_cpu_seconds();
            t1 += series(&keiro, &format!("s1-{round}"), per_round, 1).await?;
            cpu1 += process_cpu_seconds() - cpu;
            let cpu = process_cpu_seconds();
            t10 += series(&keiro, &format!("s10-{round}"), per_round, 10).await?;
            cpu10 += process_cpu_seconds() - cpu;
        }
        keiro.store().close().await;
        Ok((t0, t1, t10, t_raw, cpu10 - cpu1))
    })
    .await?;
    let n = f64::from(SEQ_WORKFLOWS);
    if emit_0 {
        cfg.emit(Figure::new("seq_0steps", n / t0, "wf/s").with("workflows", SEQ_WORKFLOWS));
    }
    if emit_10 {
        let steps = n * 10.0;
        let us_per_step = (t10 - t1) * 1e6 / (n * 9.0);
        let raw_us = t_raw * 1e6 / n;
        cfg.emit(Figure::new("seq_10steps", n / t10, "wf/s").with("workflows", SEQ_WORKFLOWS));
        cfg.emit(Figure::new("seq_10steps", steps / t10, "steps/s"));
        cfg.emit(
            Figure::new("seq_10steps", us_per_step, "us/step")
                .with(
                    "how",
                    "(time of 500 wf x 10 steps - time of 500 wf x 1 step) / 4500",
                )
                .with("raw_commit_us_interleaved", round3(raw_us))
                .with("ratio_to_interleaved_raw", round3(us_per_step / raw_us))
                .with(
                    "bench_process_cpu_us_per_step",
                    round3(step_cpu * 1e6 / (n * 9.0)),
                ),
        );
    }
    Ok(())
}

/// `seq_10steps_pipelined`: [`sequential`]'s 10-step series with a
/// pipelined journal (steps run while their rows commit; the run's end waits
/// for them), next to a 1-step pipelined series and plain commits, interleaved
/// in rounds. `us/step` is `(t10 - t1) / 9` per workflow as for
/// `seq_10steps`.
pub(crate) async fn sequential_pipelined(cfg: &Config) -> BenchResult {
    let (t1, t10, t_raw) = with_fresh_db(cfg.backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        series_journaled(&keiro, "warm", WARMUP, 10, Journal::Pipelined).await?;
        let raw_id = uuid::Uuid::new_v4().to_string();
        let per_round = SEQ_WORKFLOWS / SEQ_ROUNDS;
        let (mut t1, mut t10, mut t_raw) = (0.0, 0.0, 0.0);
        for round in 0..SEQ_ROUNDS {
            t_raw += plain_commits(&keiro, &raw_id, round * per_round, per_round).await?;
            let tag = format!("p1-{round}");
            t1 += series_journaled(&keiro, &tag, per_round, 1, Journal::Pipelined).await?;
            let tag = format!("p10-{round}");
            t10 += series_journaled(&keiro, &tag, per_round, 10, Journal::Pipelined).await?;
        }
        keiro.store().close().await;
        Ok((t1, t10, t_raw))
    })
    .await?;
    let n = f64::from(SEQ_WORKFLOWS);
    let us_per_step = (t10 - t1) * 1e6 / (n * 9.0);
    let raw_us = t_raw * 1e6 / n;
    cfg.emit(
        Figure::new("seq_10steps_pipelined", us_per_step, "us/step")
            .with("journal", "pipelined")
            .with(
                "how",
                "(time of 500 wf x 10 steps - time of 500 wf x 1 step) / 4500",
            )
            .with("raw_commit_us_interleaved", round3(raw_us))
            .with("ratio_to_interleaved_raw", round3(us_per_step / raw_us))
            .with("whole_workflow_us_per_step", round3(t10 * 1e6 / (n * 10.0))),
    );
    cfg.emit(
        Figure::new("seq_10steps_pipelined", n / t10, "wf/s").with("workflows", SEQ_WORKFLOWS),
    );
    Ok(())
}

/// Runs workflows of 3 no-op steps with ids `{tag}-0`, `{tag}-1`, …, at most
/// [`IN_FLIGHT`] at once, until `n` have started or `stop()` says so (asked
/// before each start); waits for those started and returns how many
/// completed.
pub(crate) async fn concurrent_3steps(
    keiro: &Keiro,
    tag: &str,
    n: u32,
    stop: impl Fn() -> bool,
) -> BenchResult<u32> {
    let mut runs = futures::stream::iter(0..n)
        .take_while(|_| std::future::ready(!stop()))
        .map(|i| {
            let keiro = keiro.clone();
            async move { bench_steps(3).id(format!("{tag}-{i}")).on(&keiro).await }
        })
        .buffer_unordered(IN_FLIGHT);
    let mut completed = 0;
    while let Some(out) = runs.next().await {
        if out? != 3 {
            return Err(fail("bench_steps(3) returned a wrong sum"));
        }
        completed += 1;
    }
    Ok(completed)
}

/// `concurrent_3steps`: 2,000 workflows of 3 no-op steps, at most 64 in flight.
pub(crate) async fn concurrent(cfg: &Config) -> BenchResult {
    let backend = cfg.backend;
    let (secs, step_rows, instances, completed) = with_fresh_db(backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        series(&keiro, "warm", WARMUP, 3).await?;
        let (workflows_table, steps_table) = tables(backend);
        let rows_before = count(
            keiro::unstable::raw_store(&keiro),
            &format!("SELECT count(*) FROM {steps_table}"),
        )
        .await?;
        let started = Instant::now();
        concurrent_3steps(&keiro, "c", CONCURRENT_WORKFLOWS, || false).await?;
        let secs = started.elapsed().as_secs_f64();
        let step_rows = count(
            keiro::unstable::raw_store(&keiro),
            &format!("SELECT count(*) FROM {steps_table}"),
        )
        .await?
            - rows_before;
        let instances = count(
            keiro::unstable::raw_store(&keiro),
            &format!("SELECT count(*) FROM {workflows_table} WHERE id LIKE 'c-%'"),
        )
        .await?;
        let completed = count(
            keiro::unstable::raw_store(&keiro),
            &format!(
                "SELECT count(*) FROM {workflows_table} WHERE id LIKE 'c-%' AND status = 'completed'"
            ),
        )
        .await?;
        keiro.store().close().await;
        Ok((secs, step_rows, instances, completed))
    })
    .await?;
    let n = f64::from(CONCURRENT_WORKFLOWS);
    cfg.emit(
        Figure::new("concurrent_3steps", n / secs, "wf/s")
            .with("workflows", CONCURRENT_WORKFLOWS)
            .with("in_flight", IN_FLIGHT),
    );
    cfg.emit(
        Figure::new(
            "concurrent_3steps",
            step_rows as f64 / secs,
            "journal writes/s (step rows inserted, counted in the steps table)",
        )
        .with("step_rows", step_rows),
    );
    // Every row write the runtime makes for these workflows: the step rows,
    // plus the instance row's insert (create) and its update to completed
    // (finish), both counted in the workflows table.
    let all = step_rows + instances + completed;
    cfg.emit(
        Figure::new(
            "concurrent_3steps",
            all as f64 / secs,
            "row writes/s (step rows + instance inserts + instance finishes)",
        )
        .with("row_writes", all),
    );
    Ok(())
}
