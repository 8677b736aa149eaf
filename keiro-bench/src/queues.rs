//! `queue_throughput`: 10,000 one-step workflows enqueued on a queue with
//! `concurrency = 8`, run by two workers (two runtimes in this process, each
//! with its own executor identity and resume worker), next to the same
//! workload on the default queue (no limits). Timed from the moment the
//! workers start (the instances are all enqueued before) until all are
//! completed. The step counts how many run at once; the most it saw is
//! reported next to the rate (it must be at most 8 on the queue). A third
//! run puts the instances on the default queue with each worker running at
//! most 4: as many in flight as the queue allows, without its bookkeeping,
//! which separates what the queue costs from what running only 8 costs.
//! Each run also reports how fast its 10,000 enqueues (32 at a time) were
//! recorded (`queue_enqueue`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use keiro::{step, workflow, Keiro, ResumeOptions};

use crate::common::{count, fail, tables, with_fresh_db, BenchResult, Config, Figure};

keiro::queue!(BENCH_QUEUE = "bench-queue", concurrency = 8);

/// Workflows per run.
const WORKFLOWS: usize = 10_000;
/// The queue's concurrency.
const CONCURRENCY: usize = 8;
/// Enqueue calls in flight at once.
const ENQUEUES_AT_ONCE: usize = 32;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Counts itself in flight for one scheduler turn.
#[step]
async fn counted(n: u32) -> u32 {
    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_IN_FLIGHT.fetch_max(now, Ordering::SeqCst);
    tokio::task::yield_now().await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    n
}

/// One counted step.
#[workflow(name = "bench_queued")]
async fn bench_queued(n: u32) -> u32 {
    counted(n).await
}

/// Where a run's instances wait, and how many its workers run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    /// On `BENCH_QUEUE` (concurrency 8).
    Queue,
    /// On the default queue, each worker at its default concurrency.
    Default,
    /// On the default queue, each worker running at most 4 (8 in all): the
    /// same number in flight as the queue allows, without its bookkeeping.
    DefaultEight,
}

impl Setting {
    fn label(self) -> &'static str {
        match self {
            Setting::Queue => "concurrency 8",
            Setting::Default => "default queue, no limits",
            Setting::DefaultEight => "default queue, workers of concurrency 4 (8 in all)",
        }
    }
}

/// The `queue_throughput` workload.
pub(crate) async fn queue_throughput(cfg: &Config) -> BenchResult {
    for setting in [Setting::Queue, Setting::Default, Setting::DefaultEight] {
        let (enqueued, rate, most) = with_fresh_db(cfg.backend, |db| async move {
            one_run(cfg, &db.url, setting).await
        })
        .await?;
        cfg.emit(
            Figure::new("queue_enqueue", enqueued, "wf/s")
                .with("queue", setting.label())
                .with("workflows", WORKFLOWS)
                .with("at_once", ENQUEUES_AT_ONCE),
        );
        cfg.emit(
            Figure::new("queue_throughput", rate, "wf/s")
                .with("queue", setting.label())
                .with("workflows", WORKFLOWS)
                .with("workers", 2)
                .with("max_in_flight", most),
        );
        if setting == Setting::Queue && most > CONCURRENCY {
            return Err(fail(format!(
                "queue_throughput saw {most} in flight on a queue of concurrency {CONCURRENCY}"
            )));
        }
    }
    Ok(())
}

/// One run: the enqueues' rate, the workers' rate, and the most in flight.
async fn one_run(cfg: &Config, url: &str, setting: Setting) -> BenchResult<(f64, f64, usize)> {
    let keiro: Keiro = cfg.builder(url).connect().await?;
    IN_FLIGHT.store(0, Ordering::SeqCst);
    MOST_IN_FLIGHT.store(0, Ordering::SeqCst);
    let enqueue_started = Instant::now();
    let enqueues = futures::stream::iter(0..WORKFLOWS as u32)
        .map(|n| {
            let call = bench_queued(n).on(&keiro).id(format!("q-{n}"));
            async move {
                match setting {
                    Setting::Queue => call.queue(&BENCH_QUEUE).enqueue().await,
                    Setting::Default | Setting::DefaultEight => call.enqueue().await,
                }
            }
        })
        .buffer_unordered(ENQUEUES_AT_ONCE)
        .collect::<Vec<_>>()
        .await;
    for enqueued in enqueues {
        enqueued?;
    }
    let enqueue_rate = WORKFLOWS as f64 / enqueue_started.elapsed().as_secs_f64();
    let options = || {
        let options = ResumeOptions::default().poll_interval(Duration::from_millis(50));
        match setting {
            Setting::DefaultEight => options.concurrency(CONCURRENCY / 2),
            Setting::Queue | Setting::Default => options,
        }
    };
    let other: Keiro = cfg.builder(url).connect().await?;
    let started = Instant::now();
    let workers = [
        keiro.resume_worker(options()).await?,
        other.resume_worker(options()).await?,
    ];
    let (workflows, _) = tables(cfg.backend);
    let done = format!("SELECT count(*) FROM {workflows} WHERE status = 'completed'");
    let store = keiro::unstable::raw_store(&keiro);
    while count(store, &done).await? < WORKFLOWS as i64 {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(fail("queue_throughput did not finish within 10 minutes"));
        }
        // Counting reads every row: often enough for a run of seconds, not
        // so often that the count takes the workers' CPU.
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    for worker in workers {
        worker.shutdown().await;
    }
    Ok((
        enqueue_rate,
        WORKFLOWS as f64 / secs,
        MOST_IN_FLIGHT.load(Ordering::SeqCst),
    ))
}
