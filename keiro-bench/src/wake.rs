//! `wake_latency`: an awakeable is resolved, and the waiting workflow's next
//! step starts. The resolver records the wall clock just before resolving;
//! the next step records it as its body starts (same machine, same clock).
//!
//! Variants (what each measures):
//! - `push_notify_suspended` (PostgreSQL): resolver in another process; the
//!   workflow is suspended (`suspend_after` 0); the resolver's `NOTIFY
//!   keiro_wake` wakes the resume worker (poll interval 60 s, so only the
//!   notification counts), whose pass claims the instance, loads its
//!   journal, replays and runs the next step.
//! - `push_notify_in_memory` (PostgreSQL): resolver in another process; the
//!   workflow waits in memory (`suspend_after` 60 s); the `NOTIFY` carrying
//!   its id reaches this process's listener, which wakes the waiter.
//! - `push_in_process`: resolver in the same process (another task); the
//!   workflow waits in memory and the in-process notification wakes it. The
//!   only push SQLite has.
//! - `poll_in_memory` (SQLite): resolver in another process; the workflow
//!   waits in memory and sees the answer at its next store poll (keiro's
//!   `STEP_POLL`, 20 ms when written): nothing crosses processes on SQLite.
//! - `poll_suspended`: resolver in another process; the workflow is
//!   suspended and a resume pass every 1 s (the default poll interval; a
//!   `resume_once` loop without a `NOTIFY` listener) picks it up.
//!
//! Before each resolution the bench waits a random delay, so the resolution
//! falls at a uniformly random phase of the waiter's poll.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use keiro::{Keiro, ResumeOptions, SqliteSynchronous, WorkflowHandle, WorkflowStatus};
use tokio::sync::mpsc;

use crate::common::{
    builder, fail, percentile, random_below, read_stdin_line, reply, stdin_lines, sync_name,
    with_fresh_db, Backend, BenchResult, ChildProc, Config, Figure,
};
use crate::workflows::wake_probe;

/// Measured samples per variant (the 1 s polling variant takes fewer: each
/// of its samples costs up to a second).
const SAMPLES: u32 = 50;
/// Samples of `poll_suspended`.
const POLL_SUSPENDED_SAMPLES: u32 = 20;
/// Unmeasured samples first.
const WARMUP: u32 = 3;
/// The resume worker's default poll interval.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What the probe workflow reports to this process.
#[derive(Debug)]
enum Event {
    /// Sample `n`'s awakeable id.
    Announced(u32, String),
    /// Sample `n`'s next step started at this wall-clock time (µs).
    Woken(u32, i64),
}

static EVENTS: Mutex<Option<mpsc::UnboundedSender<Event>>> = Mutex::new(None);

fn send(event: Event) {
    if let Some(tx) = EVENTS.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        let _ = tx.send(event);
    }
}

/// Called by the probe's `announce` step.
pub(crate) fn announce(sample: u32, id: String) {
    send(Event::Announced(sample, id));
}

/// Called by the probe's `woken` step as its body starts.
pub(crate) fn woken(sample: u32, at_us: i64) {
    send(Event::Woken(sample, at_us));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Suspended, woken through the resume worker by `NOTIFY`.
    PushNotify,
    /// Resolved in this process, waiting in memory.
    PushInProcess,
    /// Resolved in another process, waiting in memory: `NOTIFY` on
    /// PostgreSQL, the periodic store poll on SQLite.
    InMemory(Backend),
    /// Suspended, picked up by a resume pass every second.
    PollSuspended,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PushNotify => "push_notify_suspended",
            Mode::PushInProcess => "push_in_process",
            Mode::InMemory(Backend::Postgres) => "push_notify_in_memory",
            Mode::InMemory(Backend::Sqlite) => "poll_in_memory",
            Mode::PollSuspended => "poll_suspended",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Mode::PushNotify => {
                "resolver in another process; workflow suspended; NOTIFY wakes the resume worker \
                 (poll 60 s), which claims, replays and runs the next step"
            }
            Mode::PushInProcess => {
                "resolver in the same process; workflow waiting in memory, woken by the \
                 in-process notification"
            }
            Mode::InMemory(Backend::Postgres) => {
                "resolver in another process; workflow waiting in memory, woken by the NOTIFY \
                 carrying its id through this process's listener"
            }
            Mode::InMemory(Backend::Sqlite) => {
                "resolver in another process; workflow waiting in memory, sees the answer at its \
                 next periodic store poll (keiro's STEP_POLL)"
            }
            Mode::PollSuspended => {
                "resolver in another process; workflow suspended; a resume pass every 1 s \
                 (no NOTIFY listener) picks it up"
            }
        }
    }

    fn suspends(self) -> bool {
        matches!(self, Mode::PushNotify | Mode::PollSuspended)
    }

    fn cross_process(self) -> bool {
        self != Mode::PushInProcess
    }

    /// The random delay before resolving, after the workflow is waiting.
    fn jitter(self) -> Duration {
        match self {
            Mode::PollSuspended => POLL_INTERVAL,
            _ => Duration::from_millis(50),
        }
    }

    fn samples(self) -> u32 {
        match self {
            Mode::PollSuspended => POLL_SUSPENDED_SAMPLES,
            _ => SAMPLES,
        }
    }
}

/// The `wake_latency` workload: every variant the backend has.
pub(crate) async fn wake_latency(cfg: &Config) -> BenchResult {
    let modes: &[Mode] = match cfg.backend {
        Backend::Postgres => &[
            Mode::PushNotify,
            Mode::InMemory(Backend::Postgres),
            Mode::PushInProcess,
            Mode::PollSuspended,
        ],
        Backend::Sqlite => &[
            Mode::PushInProcess,
            Mode::InMemory(Backend::Sqlite),
            Mode::PollSuspended,
        ],
    };
    for &mode in modes {
        let samples = with_fresh_db(cfg.backend, |db| async move {
            variant(cfg, &db.url, mode).await
        })
        .await?;
        for (stat, p) in [("p50", 50.0), ("p99", 99.0)] {
            cfg.emit(
                Figure::new("wake_latency", percentile(&samples, p), "ms")
                    .with("variant", mode.name())
                    .with("stat", stat)
                    .with("samples", samples.len())
                    .with("what", mode.what()),
            );
        }
    }
    Ok(())
}

/// The resume machinery a variant needs in this process.
enum Driver {
    None,
    Worker(keiro::ResumeWorker),
    Loop(tokio::task::JoinHandle<()>),
}

/// Runs one variant; returns the latencies in ms.
async fn variant(cfg: &Config, url: &str, mode: Mode) -> BenchResult<Vec<f64>> {
    let (tx, mut events) = mpsc::unbounded_channel();
    *EVENTS.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    let suspend_after = if mode.suspends() {
        Duration::ZERO
    } else {
        Duration::from_secs(60)
    };
    let keiro = cfg
        .builder(url)
        .suspend_after(suspend_after)
        .connect()
        .await?;
    let driver = match mode {
        Mode::PushNotify => Driver::Worker(
            keiro
                .resume_worker(ResumeOptions::default().poll_interval(Duration::from_secs(60)))
                .await?,
        ),
        Mode::PollSuspended => {
            let keiro = keiro.clone();
            Driver::Loop(tokio::spawn(async move {
                loop {
                    let _ = keiro.resume_once(&ResumeOptions::default()).await;
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            }))
        }
        _ => Driver::None,
    };
    let mut resolver = if mode.cross_process() {
        let mut child = ChildProc::spawn(&["resolver", url, sync_name(cfg.sync)], &[])?;
        child
            .line_starting("READY", Duration::from_secs(60))
            .await?;
        Some(child)
    } else {
        None
    };
    // Let the worker's LISTEN connection come up.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut latencies = Vec::new();
    for sample in 0..WARMUP + mode.samples() {
        let id = format!("wake-{}-{sample}", mode.name());
        let handle: WorkflowHandle<i64> = wake_probe(sample).id(&id).on(&keiro).start().await?;
        let awakeable = loop {
            match next_event(&mut events).await? {
                Event::Announced(n, awakeable) if n == sample => break awakeable,
                _ => {}
            }
        };
        if mode.suspends() {
            wait_status(&handle, |s| *s == WorkflowStatus::Suspended).await?;
        } else {
            // The announce step's commit, then the workflow waits.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(random_below(mode.jitter())).await;
        let resolved_at = match resolver.as_mut() {
            Some(child) => {
                child.send(&awakeable).await?;
                let line = child
                    .line_starting("RESOLVED", Duration::from_secs(30))
                    .await?;
                line.parse::<i64>()
                    .map_err(|_| fail(format!("resolver said: {line}")))?
            }
            None => {
                let at = crate::common::now_us();
                keiro.resolve_awakeable(&awakeable, 1_u64).await?;
                at
            }
        };
        let woke_at = loop {
            match next_event(&mut events).await? {
                Event::Woken(n, at) if n == sample => break at,
                _ => {}
            }
        };
        wait_status(&handle, WorkflowStatus::is_final).await?;
        if sample >= WARMUP {
            latencies.push((woke_at - resolved_at) as f64 / 1e3);
        }
    }

    match driver {
        Driver::Worker(worker) => worker.shutdown().await,
        Driver::Loop(task) => task.abort(),
        Driver::None => {}
    }
    if let Some(child) = resolver {
        child.finish().await?;
    }
    keiro.store().close().await;
    *EVENTS.lock().unwrap_or_else(|p| p.into_inner()) = None;
    Ok(latencies)
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>) -> BenchResult<Event> {
    tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .map_err(|_| fail("the probe workflow went silent for 30 s"))?
        .ok_or_else(|| fail("event channel closed"))
}

/// Polls the instance's status (every 2 ms, 30 s at most) until `done`.
async fn wait_status(
    handle: &WorkflowHandle<i64>,
    done: impl Fn(&WorkflowStatus) -> bool,
) -> BenchResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = handle.status().await?;
        if done(&status) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(fail(format!(
                "workflow {} stuck at {status:?}",
                handle.id()
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Child `resolver <url> <sync>`: resolves each awakeable id read from stdin
/// with `1u64`, printing `RESOLVED <wall clock µs just before resolving>`.
pub(crate) async fn child_resolver(url: &str, sync: SqliteSynchronous) -> BenchResult {
    let keiro: Keiro = builder(url, sync).connect().await?;
    reply("READY");
    let mut lines = stdin_lines();
    while let Some(id) = read_stdin_line(&mut lines).await? {
        let at = crate::common::now_us();
        match keiro.resolve_awakeable(id.trim(), 1_u64).await {
            Ok(()) => reply(&format!("RESOLVED {at}")),
            Err(e) => reply(&format!("RESOLVED error: {e}")),
        }
    }
    keiro.store().close().await;
    Ok(())
}
