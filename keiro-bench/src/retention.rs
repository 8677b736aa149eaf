//! `gc_rate`: how fast `keiro.gc` deletes while workflows run beside it, and
//! what it costs them. 100,000 finished 3-step instances, aged past the
//! cutoff, are deleted while `concurrent_3steps` runs, in 4-second windows
//! that alternate with windows of the same driver alone (the reference
//! rate); a gc run cut short by its window's end is resumed by the next.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::Retention;

use crate::common::{
    count, execute, fail, round3, tables, with_fresh_db, Backend, BenchResult, Config, Figure,
};
use crate::suspended::bulk_insert;
use crate::throughput::concurrent_3steps;
use crate::workflows::bench_steps;

/// Finished instances gc deletes.
const PREFILL: i64 = 100_000;
/// How long each window of `concurrent_3steps` lasts.
const WINDOW: Duration = Duration::from_secs(4);
/// The most windows beside gc (and as many alone) before gc must be done.
const MAX_ROUNDS: u32 = 30;
/// The most workflows one run may start (far more than a window completes).
const MAX_WORKFLOWS: u32 = 1_000_000;
/// The gc run's batch size.
const BATCH: usize = 500;

/// The `gc_rate` workload.
pub(crate) async fn gc_rate(cfg: &Config) -> BenchResult {
    let backend = cfg.backend;
    let report = with_fresh_db(backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        let store = keiro::unstable::raw_store(&keiro);
        bench_steps(3).id("tpl").on(&keiro).await?;
        let started = Instant::now();
        bulk_insert(store, backend, "old", PREFILL, None).await?;
        let (workflows, _) = tables(backend);
        // Two hours old: past the one-hour cutoff.
        execute(
            store,
            &format!(
                "UPDATE {workflows} SET updated_at = updated_at - 7200000000, \
                 created_at = created_at - 7200000000 WHERE id LIKE 'old-%'"
            ),
        )
        .await?;
        if backend == Backend::Postgres {
            // What autovacuum would have done to a table this size by now.
            execute(store, "ANALYZE").await?;
        }
        let prefill_s = started.elapsed().as_secs_f64();
        let rows_before = old_rows(store, backend).await?;
        concurrent_3steps(&keiro, "warm", 200, || false).await?;
        // Alternate windows alone and beside gc, so drift in the machine's
        // load hits both alike.
        let mut report = Report::default();
        for round in 0..MAX_ROUNDS {
            let started = Instant::now();
            let n = concurrent_3steps(&keiro, &format!("alone{round}"), MAX_WORKFLOWS, || {
                started.elapsed() >= WINDOW
            })
            .await?;
            report.alone.0 += n;
            report.alone.1 += started.elapsed().as_secs_f64();

            let done = Arc::new(AtomicBool::new(false));
            let gc = {
                let (keiro, done) = (keiro.clone(), done.clone());
                tokio::spawn(async move {
                    let retention =
                        Retention::finished_older_than(Duration::from_secs(3600)).batch_size(BATCH);
                    let summary = keiro.gc(&retention).await;
                    done.store(true, Ordering::SeqCst);
                    summary
                })
            };
            let started = Instant::now();
            let n = concurrent_3steps(&keiro, &format!("beside{round}"), MAX_WORKFLOWS, || {
                done.load(Ordering::SeqCst) || started.elapsed() >= WINDOW
            })
            .await?;
            report.beside.0 += n;
            report.beside.1 += started.elapsed().as_secs_f64();
            report.gc_s += started.elapsed().as_secs_f64();
            report.rounds += 1;
            if done.load(Ordering::SeqCst) {
                let summary = gc.await??;
                report.batches += summary.batches;
                break;
            }
            // Cut short: a batch in flight rolls back, the next run redoes it.
            gc.abort();
            let _ = gc.await;
        }
        let left = old_rows(store, backend).await?;
        if left != 0 {
            return Err(fail(format!(
                "{left} rows of old instances left after {MAX_ROUNDS} windows of gc"
            )));
        }
        report.rows = rows_before;
        report.prefill_s = prefill_s;
        keiro.store().close().await;
        Ok(report)
    })
    .await?;
    let (alone_n, alone_s) = report.alone;
    let (beside_n, beside_s) = report.beside;
    let alone = f64::from(alone_n) / alone_s;
    let beside = f64::from(beside_n) / beside_s;
    cfg.emit(
        Figure::new("gc_rate", report.rows as f64 / report.gc_s, "rows/s")
            .with("rows", report.rows)
            .with("instances", PREFILL)
            .with("batch_size", BATCH)
            .with("gc_s", round3(report.gc_s))
            .with("windows", report.rounds)
            .with("prefill_s", round3(report.prefill_s)),
    );
    cfg.emit(
        Figure::new("concurrent_3steps_without_gc", alone, "wf/s")
            .with("workflows", alone_n)
            .with("seconds", round3(alone_s)),
    );
    cfg.emit(
        Figure::new("concurrent_3steps_with_gc", beside, "wf/s")
            .with("workflows", beside_n)
            .with("seconds", round3(beside_s))
            .with("ratio_to_without", round3(beside / alone)),
    );
    Ok(())
}

/// The instance and journal rows of the prefilled instances.
async fn old_rows(store: &keiro_store::Store, backend: Backend) -> BenchResult<i64> {
    let (workflows, steps) = tables(backend);
    let instances = count(
        store,
        &format!("SELECT count(*) FROM {workflows} WHERE id LIKE 'old-%'"),
    )
    .await?;
    let journal = count(
        store,
        &format!("SELECT count(*) FROM {steps} WHERE workflow_id LIKE 'old-%'"),
    )
    .await?;
    Ok(instances + journal)
}

/// What the workload measured.
#[derive(Default)]
struct Report {
    prefill_s: f64,
    /// Workflows completed alone, and the seconds of those windows.
    alone: (u32, f64),
    /// Workflows completed beside gc, and the seconds of those windows.
    beside: (u32, f64),
    /// Instance and journal rows gc deleted.
    rows: i64,
    /// Batches of the gc run that finished.
    batches: u64,
    /// Seconds gc ran.
    gc_s: f64,
    /// Windows beside gc.
    rounds: u32,
}
