//! Retention: [`Keiro::gc`] deletes what finished long ago (instances with
//! their journals, children, messages, events and stream entries; journals of
//! old generations; finished process-manager timers), in short batches, so
//! the journal stops growing forever.

use std::time::Duration;

use keiro_store::{GcCursor, GcPolicy, GcRequest, GcSummary};

use crate::time::duration_us;
use crate::{Error, Keiro, Result, ResumeEvent, ResumeLog};

/// The most root instances one batch may delete.
pub const MAX_GC_BATCH: usize = 10_000;

/// While this process's workflows write, gc pauses this many times as long
/// as its last batch took before the next: it takes at most a ninth of
/// the SQLite writer's time (and of the database's), which with the CPU its
/// batches use leaves the workflows at least 80% of their throughput
/// (`keiro-bench --workload gc_rate`).
const PAUSE_FACTOR: u32 = 8;

/// What [`Keiro::gc`] deletes. Built with [`Retention::finished_older_than`]
/// and chained setters:
///
/// ```
/// use std::time::Duration;
/// use keiro::Retention;
///
/// let day = Duration::from_secs(24 * 3600);
/// let retention = Retention::finished_older_than(30 * day)
///     .failed_older_than(90 * day)
///     .batch_size(1000);
/// assert_eq!(retention.batch_size, 1000);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Retention {
    /// Completed and timed-out instances last changed longer ago than this
    /// go; so do journal rows of old generations (of any instance) created
    /// longer ago, and fired or cancelled timers last changed longer ago.
    pub finished_older_than: Duration,
    /// Failed and cancelled instances last changed longer ago than this go
    /// (`None`: [`Retention::finished_older_than`]). Keeping them longer
    /// leaves time to look into them.
    pub failed_older_than: Option<Duration>,
    /// Instances per delete transaction, 1..=10,000 (default 500): root
    /// instances with their whole trees, as many as fit (a tree larger than
    /// this goes alone in a batch of its own). Smaller batches hold locks
    /// for less time.
    pub batch_size: usize,
    /// Count what would be deleted and delete nothing.
    pub dry_run: bool,
}

impl Retention {
    /// Deletes instances finished longer ago than `age` (failed and cancelled
    /// ones too, unless [`Retention::failed_older_than`] says otherwise), in
    /// batches of 500.
    pub fn finished_older_than(age: Duration) -> Retention {
        Retention {
            finished_older_than: age,
            failed_older_than: None,
            batch_size: 500,
            dry_run: false,
        }
    }

    /// Sets [`Retention::failed_older_than`].
    pub fn failed_older_than(mut self, age: Duration) -> Self {
        self.failed_older_than = Some(age);
        self
    }

    /// Sets [`Retention::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Counts without deleting ([`Retention::dry_run`]).
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    /// Refuses settings gc cannot run with.
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > MAX_GC_BATCH {
            return Err(Error::invalid_option(
                "Retention::batch_size",
                format!(
                    "{} instances per batch; use 1..={MAX_GC_BATCH} (default 500)",
                    self.batch_size
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a retention shorter than the period of a rate limit one of
    /// `queues` counts starts over: a queue's rate limit counts the starts
    /// recorded on its instances, so deleting finished ones the window still
    /// covers would let the queue start more than its limit.
    pub(crate) fn check_rate_windows(&self, queues: &[&'static crate::Queue]) -> Result<()> {
        for queue in queues {
            if let Some((starts, period)) = queue.rate_limit() {
                self.check_rate_window(queue.name(), starts, period, "")?;
            }
        }
        Ok(())
    }

    /// Refuses this retention for queue `name`'s rate limit of `starts` per
    /// `period` (see [`Retention::check_rate_windows`]); `whose` says where
    /// the limit comes from, if not from this binary.
    fn check_rate_window(
        &self,
        name: &str,
        starts: u32,
        period: Duration,
        whose: &str,
    ) -> Result<()> {
        let kept = self
            .failed_older_than
            .map_or(self.finished_older_than, |failed| {
                failed.min(self.finished_older_than)
            });
        if kept >= period {
            return Ok(());
        }
        Err(Error::invalid_option(
            "Retention",
            format!(
                "finished instances are kept {kept:?}, but queue `{name}`{whose} limits its \
                 starts to {starts} per {period:?}, counted on its instances: gc would forget \
                 starts the window still counts; keep them at least {period:?}"
            ),
        ))
    }

    /// The store's policy for a run starting at `now` (µs).
    fn policy(&self, now: i64) -> GcPolicy {
        let failed = self.failed_older_than.unwrap_or(self.finished_older_than);
        GcPolicy {
            finished_before: now.saturating_sub(duration_us(self.finished_older_than)),
            failed_before: now.saturating_sub(duration_us(failed)),
            batch_size: self.batch_size as i64,
            dry_run: self.dry_run,
        }
    }
}

impl Keiro {
    /// Refuses `retention` when it is shorter than the rate-limit period of
    /// a queue another live resume worker registered in the store
    /// ([`keiro_store::Store::registered_queue_limits`]): what a process
    /// that declares no queue itself (the `keiro` command, a service that
    /// only enqueues) knows of them.
    pub(crate) async fn check_registered_rate_windows(&self, retention: &Retention) -> Result<()> {
        // Liveness is real time whatever the runtime's clock.
        let alive_since =
            keiro_store::now_us() - duration_us(crate::runtime::identity::EXECUTOR_TTL);
        let store = self.raw_store();
        for (queue, limits) in store
            .registered_queue_limits(self.owner(), alive_since)
            .await?
        {
            if let Some((starts, period)) = crate::Queue::registered_rate_limit(&limits) {
                retention.check_rate_window(
                    &queue,
                    starts,
                    period,
                    " (as a resume worker registered it)",
                )?;
            }
        }
        Ok(())
    }

    /// Deletes what `retention` selects, in batches, and says what went.
    ///
    /// Only root instances (no parent) are candidates: completed and
    /// timed-out ones last changed before `now - finished_older_than`, failed
    /// and cancelled ones before `now - failed_older_than`. A root goes with
    /// its whole tree of descendants (journals of every generation, messages
    /// addressed to them, events, stream entries), and only when every
    /// instance of the tree is finished: nothing pending, running, suspended
    /// or set aside is ever deleted, nor a finished child of an unfinished
    /// root. Journal rows of generations below an instance's current one
    /// (continue-as-new), and the messages those generations consumed, go by
    /// the finished age whatever the instance's status; so do fired and
    /// cancelled process-manager timers.
    ///
    /// Deleted ids are free again: a workflow or once-only timer started
    /// later under one of them starts afresh.
    ///
    /// Each batch is one short transaction of at most `batch_size` instances,
    /// roots with their whole trees (a larger tree goes alone). On SQLite batches go through the runtime's journal
    /// writer and take turns with workflow writes (one batch per commit
    /// round); on PostgreSQL a batch locks only the finished rows it
    /// deletes. While workflows of this process write, gc pauses eight times
    /// as long as its last batch took before the next, so they keep most of
    /// the database's time; otherwise batches run back to back.
    ///
    /// A dry run runs the same batches and rolls each back. Invalid settings
    /// are [`Error::InvalidOption`], and so is a retention shorter than the
    /// period of a rate limit of a queue this binary declares, or one
    /// another live resume worker registered (the window counts the starts
    /// recorded on finished instances too).
    pub async fn gc(&self, retention: &Retention) -> Result<GcSummary> {
        retention.validate()?;
        retention.check_rate_windows(self.registry().queues())?;
        self.check_registered_rate_windows(retention).await?;
        let policy = retention.policy(self.now_us());
        let mut cursor = GcCursor::default();
        let mut summary = GcSummary::default();
        loop {
            let request = GcRequest { policy, cursor };
            let rounds = self.writer().rounds();
            let progress = if self.raw_store().backend() == "sqlite" {
                self.writer().gc_batch(request).await?
            } else {
                self.raw_store().gc_batch(request).await?
            };
            summary.add(&progress.summary);
            match progress.next {
                Some(next) => cursor = next,
                None => return Ok(summary),
            }
            if self.writer().rounds() != rounds {
                tokio::time::sleep(progress.took * PAUSE_FACTOR).await;
            }
        }
    }

    /// The resume worker's periodic gc: runs `retention` now and then every
    /// `interval`, reporting each run to `log`; a failure waits for the next
    /// interval. Runs until aborted.
    pub(crate) async fn gc_every(self, retention: Retention, interval: Duration, log: ResumeLog) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.gc(&retention).await {
                Ok(summary) => log(&ResumeEvent::Gc(summary)),
                Err(error) => log(&ResumeEvent::GcFailed { error }),
            }
        }
    }
}

/// [`Keiro::gc`] on the process-wide runtime.
pub async fn gc(retention: &Retention) -> Result<GcSummary> {
    crate::runtime::global().await?.gc(retention).await
}
