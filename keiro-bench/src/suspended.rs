//! `suspended_1m`: 1,000,000 workflows sleeping far in the future plus 1,000
//! due, next to the same with 1,000 sleeping. The rows are bulk-inserted with
//! SQL as copies of a real suspended instance of `bench_sleeper` (its
//! workflow row and its journaled sleep), so the due ones are runnable
//! instances of a registered workflow. A fresh worker process then runs one
//! idle pass (nothing due yet: it takes the executor identity and warms the
//! pool), waits until the 1,000 come due, and times the pass that advances
//! them; it reports its `VmRSS` after that pass.

use std::time::{Duration, Instant};

use keiro::{ResumeOptions, SqliteSynchronous, WorkflowStatus};
use keiro_store::now_us;
use keiro_store::Store;

use crate::common::{
    builder, count, execute, fail, peak_rss_mib, plain_store, reply, round3, rss_mib, sync_name,
    tables, with_fresh_db, Backend, BenchResult, ChildProc, Config, Figure,
};
use crate::workflows::bench_sleeper;

/// Instances that come due.
const DUE: i64 = 1_000;
/// The two scales of sleeping instances.
const SCALES: [i64; 2] = [1_000, 1_000_000];
/// How far in the future the sleepers wake: ten years.
const FAR_MS: u64 = 10 * 365 * 24 * 3600 * 1000;
/// How long after the bulk insert the due ones come due (the worker process
/// starts and runs its idle pass in between), in µs like the store's times.
const DUE_IN_US: i64 = 3_000_000;

const COLUMNS: &str = "name, generation, status, input, output, error, attempts, lease_owner, \
     lease_expires_at, wake_at, parent_id, parent_seq, parent_generation, created_at, updated_at";

/// The `suspended_1m` workload.
pub(crate) async fn suspended_1m(cfg: &Config) -> BenchResult {
    for sleeping in SCALES {
        let report = with_fresh_db(cfg.backend, |db| async move {
            scale(cfg, &db.url, sleeping).await
        })
        .await?;
        cfg.emit(
            Figure::new("suspended_1m", report.rss_after, "MiB")
                .with("sleeping", sleeping)
                .with("due", DUE)
                .with("what", "VmRSS of the worker process after the pass")
                .with("rss_before_pass_mib", round3(report.rss_before))
                .with("peak_rss_mib", round3(report.peak)),
        );
        cfg.emit(
            Figure::new("suspended_1m", report.due_pass_ms, "ms")
                .with("sleeping", sleeping)
                .with("due", DUE)
                .with(
                    "what",
                    "back-to-back Keiro::resume_once passes advancing the due instances to completion",
                ),
        );
        cfg.emit(
            Figure::new("suspended_1m", report.idle_pass_ms, "ms")
                .with("sleeping", sleeping)
                .with("due", 0)
                .with(
                    "what",
                    "Keiro::resume_once with nothing due (first pass of the process)",
                )
                .with("bulk_insert_s", round3(report.insert_s)),
        );
    }
    Ok(())
}

/// What one scale measured.
#[derive(Debug)]
struct Report {
    rss_after: f64,
    rss_before: f64,
    peak: f64,
    due_pass_ms: f64,
    idle_pass_ms: f64,
    insert_s: f64,
}

async fn scale(cfg: &Config, url: &str, sleeping: i64) -> BenchResult<Report> {
    // A real suspended sleeper to copy.
    let keiro = cfg.builder(url).connect().await?;
    let template = bench_sleeper(FAR_MS).id("tpl").on(&keiro).start().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while template.status().await? != WorkflowStatus::Suspended {
        if Instant::now() > deadline {
            return Err(fail("the template sleeper never suspended"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    keiro.store().close().await;
    drop(keiro);

    let store = plain_store(cfg, url).await?;
    let inserted = Instant::now();
    bulk_insert(&store, cfg.backend, "sleeping", sleeping, None).await?;
    let due_at = now_us() + DUE_IN_US;
    bulk_insert(&store, cfg.backend, "due", DUE, Some(due_at)).await?;
    let insert_s = inserted.elapsed().as_secs_f64();
    match cfg.backend {
        Backend::Postgres => {
            // What autovacuum would have done by now, and no checkpoint
            // landing inside the measured pass.
            execute(&store, "ANALYZE keiro.workflows").await?;
            execute(&store, "ANALYZE keiro.steps").await?;
            execute(&store, "CHECKPOINT").await?;
        }
        Backend::Sqlite => {
            execute(&store, "PRAGMA wal_checkpoint(TRUNCATE)").await?;
        }
    }
    if now_us() >= due_at - 1_000_000 {
        return Err(fail(
            "preparing took too long: the due instances are due already",
        ));
    }

    let mut worker = ChildProc::spawn(
        &[
            "suspended-pass",
            url,
            sync_name(cfg.sync),
            &due_at.to_string(),
        ],
        &[],
    )?;
    let line = worker
        .line_starting("PASS", Duration::from_secs(120))
        .await?;
    worker.finish().await?;
    let fields: Vec<f64> = line
        .split_whitespace()
        .map(|f| f.parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| fail(format!("bad PASS line: {line}")))?;
    let [due_pass_ms, idle_pass_ms, rss_after, rss_before, peak, completed] = fields[..] else {
        return Err(fail(format!("bad PASS line: {line}")));
    };
    if completed as i64 != DUE {
        return Err(fail(format!("the pass completed {completed} of {DUE}")));
    }

    let (workflows, _) = tables(cfg.backend);
    let done = count(
        &store,
        &format!("SELECT count(*) FROM {workflows} WHERE id LIKE 'due-%' AND status = 'completed'"),
    )
    .await?;
    let still = count(
        &store,
        &format!(
            "SELECT count(*) FROM {workflows} WHERE id LIKE 'sleeping-%' AND status = 'suspended'"
        ),
    )
    .await?;
    if done != DUE || still != sleeping {
        return Err(fail(format!(
            "after the pass: {done} due completed (want {DUE}), {still} still sleeping \
             (want {sleeping})"
        )));
    }
    store.close().await;
    Ok(Report {
        rss_after,
        rss_before,
        peak,
        due_pass_ms,
        idle_pass_ms,
        insert_s,
    })
}

/// Inserts `n` copies of the template instance `tpl` (`<prefix>-<i>`), with
/// its journal; with `due`, the copies wake at `due` (µs since the Unix
/// epoch), which is also their journaled sleep deadline (the journal and the
/// row share the unit).
pub(crate) async fn bulk_insert(
    store: &Store,
    backend: Backend,
    prefix: &str,
    n: i64,
    due: Option<i64>,
) -> BenchResult {
    let (workflows, steps) = tables(backend);
    let (wake, result) = match due {
        Some(at) => (at.to_string(), format!("'{at}'")),
        None => ("wake_at".to_owned(), "result".to_owned()),
    };
    let columns = COLUMNS.replacen("wake_at", &wake, 1);
    let (instances_sql, steps_sql) = match backend {
        Backend::Sqlite => {
            let series = format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n})"
            );
            (
                format!(
                    "{series} INSERT INTO {workflows} (id, {COLUMNS}) \
                     SELECT '{prefix}-' || n.i, {columns} FROM n, {workflows} WHERE id = 'tpl'"
                ),
                format!(
                    "{series} INSERT INTO {steps} \
                     (workflow_id, generation, seq, name, kind, result, created_at) \
                     SELECT '{prefix}-' || n.i, generation, seq, name, kind, {result}, created_at \
                     FROM n, {steps} WHERE workflow_id = 'tpl'"
                ),
            )
        }
        Backend::Postgres => (
            format!(
                "INSERT INTO {workflows} (id, {COLUMNS}) \
                 SELECT '{prefix}-' || g, {columns} \
                 FROM generate_series(1, {n}) g, {workflows} WHERE id = 'tpl'"
            ),
            format!(
                "INSERT INTO {steps} (workflow_id, generation, seq, name, kind, result, created_at) \
                 SELECT '{prefix}-' || g, generation, seq, name, kind, {result}, created_at \
                 FROM generate_series(1, {n}) g, {steps} WHERE workflow_id = 'tpl'"
            ),
        ),
    };
    let rows = execute(store, &instances_sql).await?;
    if rows != n as u64 {
        return Err(fail(format!("inserted {rows} {prefix} instances, not {n}")));
    }
    let per_copy = count(
        store,
        &format!("SELECT count(*) FROM {steps} WHERE workflow_id = 'tpl'"),
    )
    .await?;
    let rows = execute(store, &steps_sql).await?;
    if rows != (n * per_copy) as u64 {
        return Err(fail(format!(
            "inserted {rows} {prefix} journal rows, not {}",
            n * per_copy
        )));
    }
    Ok(())
}

/// Child `suspended-pass <url> <sync> <due_at µs>`: one idle pass, then at
/// `due_at` the measured passes (back to back until nothing is due, as the
/// worker loop runs them). Prints `PASS <due pass ms> <idle pass ms>
/// <VmRSS after MiB> <VmRSS before MiB> <VmHWM MiB> <completed>`.
pub(crate) async fn child_pass(url: &str, sync: SqliteSynchronous, due_at: i64) -> BenchResult {
    let keiro = builder(url, sync).connect().await?;
    let options = ResumeOptions::default().batch_size(1_024);
    let started = Instant::now();
    let idle = keiro.resume_once(&options).await?;
    let idle_ms = started.elapsed().as_secs_f64() * 1e3;
    if idle.discovered != 0 {
        return Err(fail(format!("the idle pass found work: {idle:?}")));
    }
    let wait = due_at + 20_000 - now_us();
    if wait <= 0 {
        return Err(fail("the worker started after the instances came due"));
    }
    tokio::time::sleep(Duration::from_micros(wait as u64)).await;
    let rss_before = rss_mib();
    // A pass claims at most 2 x concurrency instances; the worker loop runs
    // full passes back to back, so time the passes until nothing is due.
    let started = Instant::now();
    let mut completed = 0;
    loop {
        let summary = keiro.resume_once(&options).await?;
        completed += summary.completed;
        if summary.discovered == 0 {
            break;
        }
    }
    let due_ms = started.elapsed().as_secs_f64() * 1e3;
    let rss_after = rss_mib();
    reply(&format!(
        "PASS {due_ms} {idle_ms} {rss_after} {rss_before} {} {completed}",
        peak_rss_mib(),
    ));
    keiro.store().close().await;
    Ok(())
}
