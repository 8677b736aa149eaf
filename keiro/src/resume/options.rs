//! [`ResumeOptions`]: what a resume worker does (poll, concurrency, batch,
//! log); what an instance is (lease, attempts) is the runtime's.

use crate::schedule::MissedTicks;
use std::sync::Arc;
use std::time::Duration;

use super::report::{log_to_tracing, ResumeEvent, ResumeLog};
use crate::{Error, Result, Retention};

/// Settings of the resume worker: what it does, not what an instance is.
/// The lease TTL and crash attempts of the instances it runs are the
/// runtime's ([`crate::KeiroBuilder::lease_ttl`],
/// [`crate::KeiroBuilder::max_attempts`]), so every process drives an
/// instance under the same policy.
///
/// Built from [`Default`] with chained setters (new settings may be added
/// without breaking callers):
///
/// ```
/// use std::time::Duration;
/// use keiro::ResumeOptions;
///
/// let options = ResumeOptions::default()
///     .concurrency(8)
///     .poll_interval(Duration::from_millis(200));
/// assert_eq!(options.concurrency, 8);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ResumeOptions {
    /// The pause between passes when nothing wakes the worker sooner
    /// (default 1 s; enqueues in this process and PostgreSQL notifications
    /// wake it at once). After a failed pass the next comes sooner: 100 ms,
    /// doubling with each further failure in a row, up to this interval.
    pub poll_interval: Duration,
    /// How many instances one worker advances at once (default 32).
    pub concurrency: usize,
    /// How many due instances one pass claims at most (default 512). A
    /// worker's pass claims no more than twice its free slots (of
    /// `concurrency`), and [`crate::Keiro::resume_once`] no more than twice
    /// `concurrency`: those beyond the slots start as the pass's first runs
    /// end, so claimed instances do not wait out their lease before they
    /// run. A worker whose pass got all it asked for claims again when half
    /// of its slots are free.
    pub batch_size: usize,
    /// Where events go (default: `tracing`).
    pub log: ResumeLog,
    /// What the worker deletes every [`ResumeOptions::gc_interval`] with
    /// [`crate::Keiro::gc`] (default `None`: nothing). It runs beside the
    /// passes, reports [`ResumeEvent::Gc`] or [`ResumeEvent::GcFailed`] and
    /// tries again next interval after a failure. A retention shorter than
    /// the rate-limit period of a queue this binary declares refuses to
    /// start the worker; one shorter than a period another live worker
    /// registered (mid-deploy, say) fails each gc run, as `GcFailed`, until
    /// that worker is gone.
    pub retention: Option<Retention>,
    /// How often the worker runs [`ResumeOptions::retention`]: first when it
    /// starts, then every interval (default 1 h).
    pub gc_interval: Duration,
    /// What the worker's cron scheduler does at start-up with ticks that
    /// fell while no worker ran (default [`MissedTicks::RunLatest`]: the
    /// latest missed tick of each schedule runs once).
    pub missed_ticks: MissedTicks,
}

impl std::fmt::Debug for ResumeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeOptions")
            .field("poll_interval", &self.poll_interval)
            .field("concurrency", &self.concurrency)
            .field("batch_size", &self.batch_size)
            .field("retention", &self.retention)
            .field("gc_interval", &self.gc_interval)
            .field("missed_ticks", &self.missed_ticks)
            .finish_non_exhaustive()
    }
}

impl Default for ResumeOptions {
    fn default() -> Self {
        ResumeOptions {
            poll_interval: Duration::from_secs(1),
            concurrency: 32,
            batch_size: 512,
            log: Arc::new(log_to_tracing),
            retention: None,
            gc_interval: Duration::from_secs(3600),
            missed_ticks: MissedTicks::default(),
        }
    }
}

impl ResumeOptions {
    /// Sets [`ResumeOptions::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets [`ResumeOptions::concurrency`].
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets [`ResumeOptions::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Sets [`ResumeOptions::log`].
    pub fn log(mut self, log: impl Fn(&ResumeEvent) + Send + Sync + 'static) -> Self {
        self.log = Arc::new(log);
        self
    }

    /// Sets [`ResumeOptions::retention`]: the worker runs gc periodically.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Sets [`ResumeOptions::gc_interval`].
    pub fn gc_interval(mut self, interval: Duration) -> Self {
        self.gc_interval = interval;
        self
    }

    /// How many instances one pass claims.
    /// Sets [`ResumeOptions::missed_ticks`].
    pub fn missed_ticks(mut self, missed: MissedTicks) -> Self {
        self.missed_ticks = missed;
        self
    }

    pub(super) fn claim_limit(&self) -> i64 {
        self.batch_size
            .min(self.concurrency.saturating_mul(2))
            .max(1) as i64
    }

    /// Refuses settings the worker cannot run with.
    pub fn validate(&self) -> Result<()> {
        if self.poll_interval.is_zero() {
            return Err(Error::invalid_option(
                "ResumeOptions::poll_interval",
                "a zero poll interval would spin; use at least 1 ms (default 1 s)",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid_option(
                "ResumeOptions::concurrency",
                "a worker must advance at least one instance at once; use 1 or more (default 32)",
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::invalid_option(
                "ResumeOptions::batch_size",
                "a pass must claim at least one instance; use 1 or more (default 512)",
            ));
        }
        if self.retention.is_some() && self.gc_interval.is_zero() {
            return Err(Error::invalid_option(
                "ResumeOptions::gc_interval",
                "a zero gc interval would run gc back to back; use at least 1 ms (default 1 h)",
            ));
        }
        if let Some(retention) = &self.retention {
            retention.validate()?;
        }
        Ok(())
    }
}
