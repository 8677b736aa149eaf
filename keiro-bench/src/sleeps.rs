//! `sleep_10x100ms`: one workflow, ten durable 100 ms sleeps (each journals
//! its deadline, then waits in memory: 100 ms is below `suspend_after`).

use std::time::{Duration, Instant};

use crate::common::{fail, median, round3, with_fresh_db, BenchResult, Config, Figure};
use crate::workflows::bench_sleeps;

/// Runs of the workflow; the median is reported, every run alongside.
const RUNS: usize = 3;

/// `sleep_10x100ms`: milliseconds from the call to the workflow's completion.
pub(crate) async fn sleep_10x100ms(cfg: &Config) -> BenchResult {
    let runs = with_fresh_db(cfg.backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        // Warm the pool with one short run.
        bench_sleeps(1, 1).id("warm").on(&keiro).await?;
        let mut runs = Vec::with_capacity(RUNS);
        for run in 0..RUNS {
            let started = Instant::now();
            let out = bench_sleeps(10, 100)
                .id(format!("sleep-{run}"))
                .on(&keiro)
                .await?;
            runs.push(started.elapsed().as_secs_f64() * 1e3);
            if out != 10 {
                return Err(fail("bench_sleeps returned a wrong count"));
            }
        }
        // The floor: the same ten sleeps as plain tokio timers, no journal.
        let started = Instant::now();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let tokio_ms = started.elapsed().as_secs_f64() * 1e3;
        keiro.store().close().await;
        Ok((runs, tokio_ms))
    })
    .await?;
    let (runs, tokio_ms) = runs;
    cfg.emit(
        Figure::new("sleep_10x100ms", median(&runs), "ms")
            .with("stat", "median")
            .with(
                "runs_ms",
                runs.iter().map(|r| round3(*r)).collect::<Vec<_>>(),
            )
            .with("plain_tokio_sleep_10x100ms_ms", round3(tokio_ms)),
    );
    Ok(())
}
