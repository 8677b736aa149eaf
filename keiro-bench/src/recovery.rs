//! `recovery`: a 5-step workflow is SIGKILLed right after step 2 is
//! journaled (in a child process), then a fresh process under the same
//! executor identity finishes it. Measured inside the fresh process, from the
//! first instruction of `main` to the workflow's completion; the side-effect
//! file tells which step bodies ran again.

use std::time::{Duration, Instant};

use keiro::{ResumeOptions, SqliteSynchronous};

use crate::common::{
    builder, fail, median, reply, round3, sync_name, with_fresh_db, BenchResult, ChildProc, Config,
    Figure,
};
use crate::workflows::{bench_recovery, CRASH_AFTER_2_ENV};

/// Crash-and-recover cycles; the median time is reported, every run alongside.
const RUNS: usize = 5;

/// The `recovery` workload.
pub(crate) async fn recovery(cfg: &Config) -> BenchResult {
    let runs = with_fresh_db(cfg.backend, |db| async move {
        // Migrate once, so the first child does not pay for it.
        cfg.builder(&db.url).connect().await?.store().close().await;
        let mut runs = Vec::with_capacity(RUNS);
        for run in 0..RUNS {
            runs.push(one_run(cfg, &db.url, &db.dir, run).await?);
        }
        Ok(runs)
    })
    .await?;
    let times: Vec<f64> = runs.iter().map(|r| r.0).collect();
    let connect: Vec<f64> = runs.iter().map(|r| r.1).collect();
    let reexecuted: usize = runs.iter().map(|r| r.2).sum();
    cfg.emit(
        Figure::new("recovery", median(&times), "ms")
            .with("stat", "median")
            .with(
                "what",
                "fresh process: first instruction of main -> workflow completed",
            )
            .with(
                "runs_ms",
                times.iter().map(|t| round3(*t)).collect::<Vec<_>>(),
            )
            .with(
                "connect_ms",
                connect.iter().map(|t| round3(*t)).collect::<Vec<_>>(),
            ),
    );
    cfg.emit(
        Figure::new("recovery", reexecuted as f64, "count")
            .with(
                "what",
                "bodies of steps 1-2 re-executed, summed over all runs",
            )
            .with("runs", RUNS),
    );
    Ok(())
}

/// One crash and recovery; returns (ms, ms of it connecting, steps 1–2
/// re-executed).
async fn one_run(
    cfg: &Config,
    url: &str,
    dir: &std::path::Path,
    run: usize,
) -> BenchResult<(f64, f64, usize)> {
    let id = format!("recovery-{run}");
    let executor = format!("bench-recovery-{}", uuid::Uuid::new_v4().simple());
    let file = dir.join(format!("recovery-{run}.txt"));
    let file = file.to_string_lossy().into_owned();
    let sync = sync_name(cfg.sync);

    let mut doomed = ChildProc::spawn(
        &["recovery-run", url, sync, &executor, &id, &file],
        &[(CRASH_AFTER_2_ENV, "1")],
    )?;
    doomed
        .line_starting("STEP2_DONE", Duration::from_secs(60))
        .await?;
    doomed.kill().await?;

    let mut fresh = ChildProc::spawn(&["recovery-resume", url, sync, &executor, &id], &[])?;
    let done = fresh.line_starting("DONE", Duration::from_secs(60)).await?;
    fresh.finish().await?;
    let mut parts = done.split_whitespace();
    let value: u32 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let micros: f64 = parts
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| fail(format!("bad DONE line: {done}")))?;
    let connect_micros: f64 = parts
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    if value != 15 {
        return Err(fail(format!(
            "the recovered workflow returned {value}, not 15"
        )));
    }

    let lines = std::fs::read_to_string(&file)?;
    let ran = |n: u32| lines.lines().filter(|l| *l == format!("step {n}")).count();
    for n in 3..=5 {
        if ran(n) == 0 {
            return Err(fail(format!("step {n} never ran")));
        }
    }
    let reexecuted = ran(1).saturating_sub(1) + ran(2).saturating_sub(1);
    Ok((micros / 1e3, connect_micros / 1e3, reexecuted))
}

/// Child `recovery-run <url> <sync> <executor> <id> <file>`: runs the
/// workflow until it blocks after step 2 (the parent kills it there).
pub(crate) async fn child_run(
    url: &str,
    sync: SqliteSynchronous,
    executor: &str,
    id: &str,
    file: &str,
) -> BenchResult {
    let keiro = builder(url, sync).executor_id(executor).connect().await?;
    bench_recovery(file.to_owned()).id(id).on(&keiro).await?;
    Err(fail("the workflow was meant to block after step 2"))
}

/// Child `recovery-resume <url> <sync> <executor> <id>`: a fresh process
/// under the dead one's identity runs one resume pass (what a resume worker
/// does first) and prints `DONE <value> <µs since main started> <µs of
/// that spent connecting and migrating>`.
pub(crate) async fn child_resume(
    started: Instant,
    url: &str,
    sync: SqliteSynchronous,
    executor: &str,
    id: &str,
) -> BenchResult {
    let keiro = builder(url, sync).executor_id(executor).connect().await?;
    let connected = started.elapsed();
    let summary = keiro.resume_once(&ResumeOptions::default()).await?;
    let elapsed = started.elapsed();
    if summary.completed != 1 {
        return Err(fail(format!(
            "the resume pass did not complete the workflow: {summary:?}"
        )));
    }
    let value: u32 = keiro.handle(id).await?.result().await?;
    reply(&format!(
        "DONE {value} {} {}",
        elapsed.as_micros(),
        connected.as_micros()
    ));
    Ok(())
}
