//! `workers_1_2_4` (PostgreSQL only): 2,000 three-step workflows enqueued
//! from this process, run by 1, 2 and 4 worker *processes* (children of this
//! binary running the resume worker with default options). Timed from the
//! end of the enqueue (when the workers are told to start) to the moment all
//! 2,000 are completed. Each step body appends `workflow step pid` to a
//! side-effect file, which tells whether any step ran twice; the steps table
//! must hold exactly one row per step.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use keiro::{Keiro, ResumeEvent, ResumeLog, ResumeOptions, ResumeSummary};

use crate::common::{
    count, fail, machine_cpu_ticks, process_cpu_seconds, read_stdin_line, reply, round3,
    stdin_lines, with_fresh_db, BenchResult, ChildProc, Config, Figure,
};
use crate::workflows::bench_marks;

/// Workflows per run.
const WORKFLOWS: u32 = 2_000;
/// Worker process counts.
const WORKER_COUNTS: [usize; 3] = [1, 2, 4];

/// What one run measured.
#[derive(Debug)]
struct Run {
    secs: f64,
    /// Passes, instances discovered, resumed and skipped (leased by another
    /// worker), summed over the workers.
    passes: [usize; 4],
    /// The machine's CPU use while the workers ran, in % of all cores.
    busy_pct: f64,
    /// CPU seconds the worker processes used in all.
    worker_cpu_s: f64,
    duplicate_executions: usize,
    per_worker: Vec<usize>,
}

/// The `workers_1_2_4` workload.
pub(crate) async fn workers_1_2_4(cfg: &Config) -> BenchResult {
    for workers in WORKER_COUNTS {
        let run = with_fresh_db(cfg.backend, |db| async move {
            let file = db.dir.join("marks.txt");
            one_run(cfg, &db.url, &file.to_string_lossy(), workers).await
        })
        .await?;
        cfg.emit(
            Figure::new("workers_1_2_4", f64::from(WORKFLOWS) / run.secs, "wf/s")
                .with("workers", workers)
                .with("workflows", WORKFLOWS)
                .with("steps_per_worker", run.per_worker.clone())
                .with("machine_cpu_busy_pct", round3(run.busy_pct))
                .with("passes", run.passes[0])
                .with("discovered", run.passes[1])
                .with("resumed", run.passes[2])
                .with("lease_skipped", run.passes[3])
                .with(
                    "worker_cpu_ms_per_wf",
                    round3(run.worker_cpu_s * 1e3 / f64::from(WORKFLOWS)),
                ),
        );
        cfg.emit(
            Figure::new("workers_1_2_4", run.duplicate_executions as f64, "count")
                .with("workers", workers)
                .with(
                    "what",
                    "step bodies executed more than once (journal checked: exactly one row per step)",
                ),
        );
    }
    Ok(())
}

async fn one_run(cfg: &Config, url: &str, file: &str, workers: usize) -> BenchResult<Run> {
    // Migrates; enqueueing takes no executor identity.
    let keiro: Keiro = cfg.builder(url).connect().await?;
    let mut children = Vec::with_capacity(workers);
    for w in 0..workers {
        let executor = format!("bench-worker-{w}-{}", uuid::Uuid::new_v4().simple());
        let mut child = ChildProc::spawn(&["worker", url, &executor], &[])?;
        child
            .line_starting("READY", Duration::from_secs(60))
            .await?;
        children.push(child);
    }

    let mut enqueues = futures::stream::iter(0..WORKFLOWS)
        .map(|i| {
            let keiro = keiro.clone();
            let file = file.to_owned();
            async move {
                bench_marks(file, i)
                    .id(format!("w-{i}"))
                    .on(&keiro)
                    .enqueue()
                    .await
            }
        })
        .buffer_unordered(16);
    while let Some(handle) = enqueues.next().await {
        handle?;
    }

    let ticks_before = machine_cpu_ticks();
    let started = Instant::now();
    for child in &mut children {
        child.send("GO").await?;
    }
    let deadline = started + Duration::from_secs(300);
    loop {
        let done = count(
            keiro::unstable::raw_store(&keiro),
            "SELECT count(*) FROM keiro.workflows WHERE status = 'completed'",
        )
        .await?;
        if done >= i64::from(WORKFLOWS) {
            break;
        }
        if Instant::now() > deadline {
            return Err(fail(format!(
                "only {done} of {WORKFLOWS} completed in 300 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let ticks_after = machine_cpu_ticks();
    let busy_pct = 100.0 * (ticks_after.0 - ticks_before.0) as f64
        / (ticks_after.1 - ticks_before.1).max(1) as f64;
    let mut worker_cpu_s = 0.0;
    // Passes, discovered, resumed, lease_skipped, over all workers.
    let mut passes = [0_usize; 4];
    for mut child in children {
        child.send("STOP").await?;
        let line = child.line_starting("CPU", Duration::from_secs(60)).await?;
        let fields: Vec<f64> = line
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(f64::NAN))
            .collect();
        worker_cpu_s += fields.first().copied().unwrap_or(f64::NAN);
        for (total, value) in passes.iter_mut().zip(fields.iter().skip(1)) {
            *total += *value as usize;
        }
        child.finish().await?;
    }

    let rows = count(
        keiro::unstable::raw_store(&keiro),
        "SELECT count(*) FROM keiro.steps",
    )
    .await?;
    let distinct = count(
        keiro::unstable::raw_store(&keiro),
        "SELECT count(*) FROM (SELECT DISTINCT workflow_id, generation, seq FROM keiro.steps) s",
    )
    .await?;
    let want = i64::from(WORKFLOWS) * 3;
    if rows != want || distinct != want {
        return Err(fail(format!(
            "the journal holds {rows} step rows ({distinct} distinct ids), not {want}"
        )));
    }
    let lines = std::fs::read_to_string(file)?;
    let mut executions: HashMap<(&str, &str), usize> = HashMap::new();
    let mut by_pid: HashMap<&str, usize> = HashMap::new();
    for line in lines.lines() {
        let mut parts = line.split_whitespace();
        let (Some(wf), Some(step), Some(pid)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(fail(format!("bad side-effect line: {line}")));
        };
        *executions.entry((wf, step)).or_default() += 1;
        *by_pid.entry(pid).or_default() += 1;
    }
    if executions.len() as i64 != want {
        return Err(fail(format!(
            "{} distinct steps ran, not {want}",
            executions.len()
        )));
    }
    let duplicate_executions = executions.values().map(|n| n - 1).sum();
    let mut per_worker: Vec<usize> = by_pid.into_values().collect();
    per_worker.sort_unstable_by(|a, b| b.cmp(a));
    keiro.store().close().await;
    Ok(Run {
        secs,
        passes,
        busy_pct,
        worker_cpu_s,
        duplicate_executions,
        per_worker,
    })
}

/// Child `worker <url> <executor>`: connects, prints `READY`, starts the
/// resume worker (default options) on `GO`; on `STOP` prints `CPU <seconds
/// used since GO>` and stops.
pub(crate) async fn child_worker(url: &str, executor: &str) -> BenchResult {
    let keiro = Keiro::builder(url).executor_id(executor).connect().await?;
    reply("READY");
    let mut lines = stdin_lines();
    loop {
        match read_stdin_line(&mut lines).await? {
            Some(line) if line.trim() == "GO" => break,
            Some(_) => continue,
            None => return Ok(()),
        }
    }
    let cpu_before = process_cpu_seconds();
    let totals = Arc::new(Mutex::new(ResumeSummary::default()));
    let passes = Arc::new(AtomicUsize::new(0));
    let log: ResumeLog = {
        let (totals, passes) = (totals.clone(), passes.clone());
        Arc::new(move |event: &ResumeEvent| {
            if let ResumeEvent::Pass(pass) = event {
                passes.fetch_add(1, Ordering::Relaxed);
                let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                t.discovered += pass.discovered;
                t.resumed += pass.resumed;
                t.completed += pass.completed;
                t.lease_skipped += pass.lease_skipped;
            }
        })
    };
    let worker = keiro
        .resume_worker(ResumeOptions::default().log(move |event| log(event)))
        .await?;
    while let Some(line) = read_stdin_line(&mut lines).await? {
        if line.trim() == "STOP" {
            break;
        }
    }
    // CPU seconds spent while working (the stop itself excluded), and what
    // the passes did.
    let t = *totals.lock().unwrap_or_else(|p| p.into_inner());
    reply(&format!(
        "CPU {} {} {} {} {}",
        process_cpu_seconds() - cpu_before,
        passes.load(Ordering::Relaxed),
        t.discovered,
        t.resumed,
        t.lease_skipped
    ));
    worker.shutdown().await;
    keiro.store().close().await;
    Ok(())
}
