//! The resume worker: finds unfinished instances that are due (crashed
//! mid-run, enqueued, or suspended past their wake time), claims each through
//! an expiring lease and drives it on through the link-time registry.

mod options;
mod pass;
mod report;
mod slots;
mod turns;

pub(crate) use turns::ClaimTurns;

use std::time::Duration;

use tokio::sync::watch;

use crate::shutdown::{Phase, Stop};
use crate::{Keiro, Result};
pub(crate) use slots::{Held, Slots};

/// How often a running worker looks for the due instances it cannot run
/// (unknown names, other versions, live foreign leases) and reports them.
const BLOCKED_REPORT_EVERY: Duration = Duration::from_secs(1);

/// How often a running worker ends the queued instances whose deadline
/// passed while they waited (see [`Keiro::time_out_queued`]): its poll
/// interval, within these bounds.
const PAST_DEADLINE_SWEEP_EVERY: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_millis(250));

/// The pause after the first failed pass in a row; it doubles with each
/// further one, up to the poll interval.
const RETRY_FAILED_PASS: Duration = Duration::from_millis(100);

/// The pause before the next pass: the poll interval, or after `failed`
/// failed passes in a row a shorter one that grows back to it, so a pass
/// that met a passing fault (a lost connection, a pool timed out) is
/// retried soon even when the worker polls rarely.
fn pause_after(failed: u32, poll_interval: Duration) -> Duration {
    match failed {
        0 => poll_interval,
        n => RETRY_FAILED_PASS
            .saturating_mul(1 << (n - 1).min(16))
            .min(poll_interval),
    }
}

pub use options::ResumeOptions;
pub use report::{ResumeEvent, ResumeLog, ResumeSummary};

impl Keiro {
    /// Starts the resume worker on the current tokio runtime with `options`
    /// (validated first). It runs a pass, then waits for the poll interval or
    /// a wake-up (an enqueue in this process; on PostgreSQL a notification
    /// from any process), until [`ResumeWorker::shutdown`] (or
    /// [`Keiro::shutdown`]). Passes overlap: each claims into the slots (of
    /// [`ResumeOptions::concurrency`]) the runs of earlier passes left free,
    /// and its own runs go on while the next pass claims, so a long run
    /// holds up one slot and nothing else. After a failed pass it waits 100 ms, doubling
    /// with each further failure in a row, up to the poll interval.
    ///
    /// Beside its passes it runs a cron scheduler: at each tick (by the
    /// store's clock) of a schedule whose workflow this binary links, it
    /// creates the tick's instance (see [`Keiro::schedules`]) and, when it
    /// is the worker that created it and one of its
    /// [`ResumeOptions::concurrency`] slots is free, drives it at once in
    /// that slot, without waiting for a pass (with none free, the instance
    /// waits for a pass of any worker, like an enqueued one); ticks missed
    /// while no worker ran follow [`ResumeOptions::missed_ticks`].
    pub async fn resume_worker(&self, options: ResumeOptions) -> Result<ResumeWorker> {
        options.validate()?;
        if let Some(retention) = &options.retention {
            retention.check_rate_windows(self.registry().queues())?;
        }
        self.ensure_executor().await?;
        let (phase, watched) = watch::channel(Phase::Running);
        self.listen_for_wakes();
        // Passes overlap: each drives what it claimed in a task of its
        // own, holding slots of the worker's budget, and the next pass
        // claims into the slots left free, so a long run holds up its slot
        // and nothing else. The scheduler's runs hold slots of it too.
        let slots = Slots::new(options.concurrency);
        let runs = std::sync::Arc::new(crate::schedule::tick_runs::TickRuns::new(
            options.clone(),
            Stop::of_worker(self, watched.clone()),
            slots.clone(),
        ));
        let scheduler = crate::schedule::scheduler::spawn(self, options.missed_ticks, runs.clone());
        let keiro = self.clone();
        let join = tokio::spawn(async move {
            let gc = options.retention.clone().map(|retention| {
                let (keiro, log) = (keiro.clone(), options.log.clone());
                tokio::spawn(keiro.gc_every(retention, options.gc_interval, log))
            });
            // In a task of its own: it holds no slot, so it goes on while
            // every slot is taken, and it delays no pass's runs. Dropped
            // with this task, however it ends.
            let _sweep = {
                let (keiro, options) = (keiro.clone(), options.clone());
                let (least, most) = PAST_DEADLINE_SWEEP_EVERY;
                let every = options.poll_interval.clamp(least, most);
                AbortOnDrop(tokio::spawn(async move {
                    let mut failed = 0;
                    loop {
                        tokio::time::sleep(match failed {
                            0 => every,
                            n => pause_after(n, options.poll_interval).max(every),
                        })
                        .await;
                        match keiro.time_out_queued().await {
                            Ok(()) => failed = 0,
                            Err(error) => {
                                failed += 1;
                                (options.log)(&ResumeEvent::PassFailed { error });
                            }
                        }
                    }
                }))
            };
            let mut stop = Stop::of_worker(&keiro, watched);
            let mut reported: Option<tokio::time::Instant> = None;
            let mut failed = 0;
            let mut passes = tokio::task::JoinSet::new();
            loop {
                keiro.listen_for_wakes();
                while let Some(ended) = passes.try_join_next() {
                    if let Err(error) = ended {
                        tracing::error!(%error, "keiro resume pass ended abnormally");
                    }
                }
                let held = slots.take(options.claim_limit() as usize);
                let full = held.count() == 0 || {
                    // Finding the due instances this worker cannot run reads
                    // thousands of due rows on a backlog waiting for a
                    // queue's room (it cost more than the claims), so it
                    // runs at most once per `BLOCKED_REPORT_EVERY` however
                    // often wakes start a pass.
                    let report = reported.is_none_or(|at| at.elapsed() >= BLOCKED_REPORT_EVERY);
                    if report {
                        reported = Some(tokio::time::Instant::now());
                    }
                    match keiro
                        .start_pass(&options, &stop, report, held, &mut passes)
                        .await
                    {
                        Ok(full) => {
                            failed = 0;
                            full
                        }
                        Err(error) => {
                            (options.log)(&ResumeEvent::PassFailed { error });
                            failed += 1;
                            false
                        }
                    }
                };
                if stop.is_draining() {
                    break;
                }
                if full {
                    // More may be due: claim again once half the slots are
                    // free (not at every slot freed, which would cost a pass
                    // per instance).
                    tokio::select! {
                        _ = slots.until_free((options.concurrency / 2).max(1)) => {}
                        _ = stop.draining() => break,
                    }
                    continue;
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause_after(failed, options.poll_interval)) => {}
                    _ = keiro.resume_wake().notified() => {}
                    _ = stop.draining() => break,
                }
            }
            // A stopping worker starts nothing more, ticks included. Ticks
            // are created in the store: stopping between two loses none
            // (another worker, or this one's successor, creates the next).
            scheduler.abort();
            let _ = scheduler.await;
            // What the passes claimed runs on: to its end while draining,
            // released when halted.
            while let Some(ended) = passes.join_next().await {
                if let Err(error) = ended {
                    tracing::error!(%error, "keiro resume pass ended abnormally");
                }
            }
            // The ticks it started run on like the pass's runs: to their end
            // while draining, released when halted.
            runs.wait().await;
            if let Some(gc) = gc {
                // A batch cut short rolls back; the next worker's gc redoes it.
                gc.abort();
            }
        });
        Ok(ResumeWorker {
            phase,
            join,
            keiro: self.clone(),
        })
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A running resume worker.
#[derive(Debug)]
pub struct ResumeWorker {
    phase: watch::Sender<Phase>,
    join: tokio::task::JoinHandle<()>,
    keiro: Keiro,
}

impl ResumeWorker {
    /// Shuts down promptly and cleanly: the worker claims nothing more, its
    /// runs in flight stop at once and release their leases (journal, status
    /// and attempts untouched), then its runtime is shut down with
    /// [`Keiro::shutdown`], which gives up the executor identity. Another
    /// worker resumes the released instances right away, and a new process
    /// may take the identity at once. Same as `shutdown_within(Duration::ZERO)`.
    pub async fn shutdown(self) {
        self.shutdown_within(Duration::ZERO).await
    }

    /// Like [`ResumeWorker::shutdown`], but first lets the runs in flight
    /// finish (or suspend) for up to `grace`; those still running then stop
    /// and release their leases.
    pub async fn shutdown_within(self, grace: Duration) {
        let keiro = self.keiro.clone();
        self.halt(grace).await;
        if let Err(error) = keiro.shutdown().await {
            tracing::warn!(%error, "keiro could not give up its executor identity; it lapses in 10 s");
        }
    }

    /// Stops this worker alone, as promptly as [`ResumeWorker::shutdown`]
    /// (its runs release their leases), keeping the runtime and its identity
    /// for workflows still run in this process.
    pub async fn stop(self) {
        self.halt(Duration::ZERO).await
    }

    async fn halt(mut self, grace: Duration) {
        let _ = self.phase.send(Phase::Draining);
        if grace.is_zero() || tokio::time::timeout(grace, &mut self.join).await.is_err() {
            let _ = self.phase.send(Phase::Halting);
            let _ = (&mut self.join).await;
        }
    }
}

/// Starts the resume worker of the process-wide runtime (from
/// `KEIRO_DATABASE_URL`) with default options, driving every workflow linked
/// into this binary. It logs at `info` which workflows it serves.
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> Result<(), keiro::Error> {
///     let worker = keiro::run_resume_worker().await?;
///     tokio::signal::ctrl_c().await.ok();
///     worker.shutdown().await;
///     Ok(())
/// }
/// ```
pub async fn run_resume_worker() -> Result<ResumeWorker> {
    crate::runtime::global()
        .await?
        .resume_worker(ResumeOptions::default())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_pass_is_retried_sooner_than_the_poll_interval() {
        let poll = Duration::from_secs(60);
        assert_eq!(pause_after(0, poll), poll);
        assert_eq!(pause_after(1, poll), Duration::from_millis(100));
        assert_eq!(pause_after(2, poll), Duration::from_millis(200));
        assert_eq!(pause_after(4, poll), Duration::from_millis(800));
        assert_eq!(pause_after(30, poll), poll);
        assert_eq!(pause_after(u32::MAX, poll), poll);
        let short = Duration::from_millis(50);
        assert_eq!(pause_after(1, short), short);
    }
}
