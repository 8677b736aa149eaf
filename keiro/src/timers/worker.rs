//! The timer worker: claim a due timer, hand it to the caller's fire action,
//! apply the [`FireOutcome`] it returns.

use std::collections::BTreeSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use keiro_store::{TimerStatus, TimerUpdate};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{metrics, TimerError, TimerRow, Timers};
use crate::panic::panic_message;
use crate::runtime::lock;
use crate::time::{duration_us, from_us, until_us};

/// How long a timer no fire action owns ([`FireOutcome::NotMine`]) waits
/// before it is offered again.
pub const NOT_MINE_RETRY_DELAY: Duration = Duration::from_secs(30);

/// A claimed timer and how late it was claimed (seconds), or why its stored
/// text did not decode (it was dead-lettered).
type Claimed = Result<(TimerRow, f64), TimerError>;

/// How long a timer whose fire action panicked waits before it is retried.
pub const PANIC_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Settings of a timer worker: its policy (attempt ceiling, stuck-claim
/// requeue) and, for the loop [`Timers::spawn_worker`] starts, its pace.
/// Checked by [`TimerWorkerOptions::validate`] before a worker claims
/// anything.
///
/// Built from [`Default`] with chained setters (new settings may be added
/// without breaking callers):
///
/// ```
/// use std::time::Duration;
/// use keiro::timers::TimerWorkerOptions;
///
/// let options = TimerWorkerOptions::default()
///     .max_attempts(8)
///     .poll_interval(Duration::from_millis(200));
/// assert_eq!(options.max_attempts, Some(8));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimerWorkerOptions {
    /// `Some(n)`: a timer is fired at most `n` times. Claims are counted
    /// before the check, so the claim that would be attempt `n + 1`
    /// dead-letters the timer (reason "timer exceeded attempt ceiling of n")
    /// instead of firing it: with `Some(3)`, the fourth claim. `n` must be at
    /// least 1. `None` (the default) never dead-letters on attempts.
    pub max_attempts: Option<u32>,
    /// `Some(ttl)`: each pass first moves timers claimed at least `ttl` ago
    /// and still `firing` back to `scheduled`, so a worker that died mid-fire
    /// costs a delay, not the timer. A fire action that runs longer than `ttl`
    /// may therefore be fired twice: fire actions must be idempotent (timers
    /// are at-least-once). Must be at least 1 ms. `None` disables the requeue
    /// (lapsed foreground resume claims are still recovered). Default 300 s.
    pub requeue_stuck_after: Option<Duration>,
    /// The longest pause of the [`Timers::spawn_worker`] loop when nothing
    /// is due (default 1 s). The loop wakes sooner when the earliest
    /// scheduled timer is due sooner.
    pub poll_interval: Duration,
    /// How many timers the [`Timers::spawn_worker`] loop claims between two
    /// runs of its preamble (the stale-claim requeue and the gauges), which
    /// also runs at least once a poll interval (default 256). [`Timers::drain`]
    /// takes its own limit.
    pub batch_size: usize,
    /// How many fire actions the [`Timers::spawn_worker`] loop runs at once
    /// (default 16). A fire action that takes long holds one of them, not
    /// the worker: the others go on claiming and firing timers as they come
    /// due. With 1, timers fire one after another. [`Timers::drain`] always
    /// fires one after another.
    pub concurrency: usize,
}

impl Default for TimerWorkerOptions {
    fn default() -> Self {
        TimerWorkerOptions {
            max_attempts: None,
            requeue_stuck_after: Some(Duration::from_secs(300)),
            poll_interval: Duration::from_secs(1),
            batch_size: 256,
            concurrency: 16,
        }
    }
}

impl TimerWorkerOptions {
    /// Sets [`TimerWorkerOptions::max_attempts`]: `8` or `Some(8)` for a
    /// ceiling, `None` for none.
    pub fn max_attempts(mut self, n: impl Into<Option<u32>>) -> Self {
        self.max_attempts = n.into();
        self
    }

    /// Sets [`TimerWorkerOptions::requeue_stuck_after`]: a duration, or
    /// `None` to turn the requeue off.
    pub fn requeue_stuck_after(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.requeue_stuck_after = ttl.into();
        self
    }

    /// Sets [`TimerWorkerOptions::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets [`TimerWorkerOptions::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Sets [`TimerWorkerOptions::concurrency`].
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Refuses values the worker cannot run with.
    pub fn validate(&self) -> Result<(), TimerError> {
        if self.poll_interval.is_zero() {
            return Err(TimerError::InvalidOption {
                option: "poll_interval",
                reason: "a zero poll interval would spin; use at least 1 ms (default 1 s)".into(),
            });
        }
        if self.batch_size == 0 {
            return Err(TimerError::InvalidOption {
                option: "batch_size",
                reason: "a worker must claim at least one timer between two preambles; use 1 or \
                         more (default 256)"
                    .into(),
            });
        }
        if self.concurrency == 0 {
            return Err(TimerError::InvalidOption {
                option: "concurrency",
                reason: "a worker must fire at least one timer at a time; use 1 or more \
                         (default 16)"
                    .into(),
            });
        }
        if self.max_attempts == Some(0) {
            return Err(TimerError::InvalidOption {
                option: "max_attempts",
                reason: "Some(0) would dead-letter every timer before it fires; use Some(n) \
                         with n >= 1, or None for no ceiling"
                    .into(),
            });
        }
        if let Some(ttl) = self.requeue_stuck_after {
            if ttl < Duration::from_millis(1) {
                return Err(TimerError::InvalidOption {
                    option: "requeue_stuck_after",
                    reason: format!(
                        "{ttl:?} would requeue timers while they fire; use at least 1 ms (the \
                         default is 300 s), or None to turn the requeue off"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// What a fire action decided about the timer it was handed. The worker
/// applies it to the timer's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FireOutcome {
    /// Done: the timer is marked fired with the id of the event (or command,
    /// or any marker) its firing produced.
    Completed {
        /// What the firing produced.
        event_id: String,
    },
    /// Not done, worth another try: the timer is rescheduled `delay` from now
    /// in one statement, with `note` as its latest diagnostic. Its attempts
    /// are kept, so `max_attempts` bounds the retries.
    RetryLater {
        /// How long to wait before the next attempt.
        delay: Duration,
        /// Why, for the inspection pages (goes on the span, never on a metric).
        note: String,
    },
    /// Will never succeed (a malformed payload, a refused authorization): the
    /// timer is dead-lettered with `reason`, where an operator can find it.
    FailedPermanently {
        /// Why, for the operator.
        reason: String,
    },
    /// This action does not handle the timer's process manager: it is
    /// rescheduled [`NOT_MINE_RETRY_DELAY`] from now, for a worker that does.
    NotMine,
}

impl FireOutcome {
    /// [`FireOutcome::Completed`] with `event_id`.
    pub fn completed(event_id: impl Into<String>) -> FireOutcome {
        FireOutcome::Completed {
            event_id: event_id.into(),
        }
    }

    /// [`FireOutcome::RetryLater`] after `delay`, noting why.
    pub fn retry_later(delay: Duration, note: impl Into<String>) -> FireOutcome {
        FireOutcome::RetryLater {
            delay,
            note: note.into(),
        }
    }

    /// [`FireOutcome::FailedPermanently`] for `reason`.
    pub fn failed_permanently(reason: impl Into<String>) -> FireOutcome {
        FireOutcome::FailedPermanently {
            reason: reason.into(),
        }
    }
}

/// What the worker did with one claimed timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FireDisposition {
    /// The action completed; the timer is fired.
    Fired {
        /// What the firing produced.
        event_id: String,
    },
    /// The action asked for a retry; the timer is scheduled again.
    RetryScheduled {
        /// When it is due again.
        fire_at: SystemTime,
        /// The action's note.
        note: String,
    },
    /// The action failed permanently; the timer is dead-lettered.
    DeadLettered {
        /// The action's reason.
        reason: String,
    },
    /// The action does not own the timer; it is scheduled again.
    NotMine {
        /// When it is offered again.
        fire_at: SystemTime,
    },
    /// The claim exceeded `max_attempts`; the timer was dead-lettered without
    /// being fired.
    AttemptCeiling {
        /// The dead-letter reason recorded.
        reason: String,
    },
    /// The timer moved on while it fired (cancelled, or requeued as stale and
    /// claimed again), so the outcome was not applied.
    Superseded {
        /// The timer's status when the outcome was refused (`None`: it is gone).
        status: Option<TimerStatus>,
    },
}

impl FireDisposition {
    /// The bounded name used as the `outcome` metric label and span field:
    /// `completed`, `retry`, `dead_letter`, `not_mine`, `attempt_ceiling` or
    /// `superseded`.
    pub fn label(&self) -> &'static str {
        match self {
            FireDisposition::Fired { .. } => "completed",
            FireDisposition::RetryScheduled { .. } => "retry",
            FireDisposition::DeadLettered { .. } => "dead_letter",
            FireDisposition::NotMine { .. } => "not_mine",
            FireDisposition::AttemptCeiling { .. } => "attempt_ceiling",
            FireDisposition::Superseded { .. } => "superseded",
        }
    }
}

/// One claimed timer and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct FireReport {
    /// The timer as claimed (status `firing`, attempts counting this claim).
    pub timer: TimerRow,
    /// What the worker did with it.
    pub disposition: FireDisposition,
}

/// What one [`Timers::drain`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainSummary {
    /// Timers claimed.
    pub processed: usize,
    /// Claimed timers now fired.
    pub fired: usize,
    /// Claimed timers scheduled again for a retry.
    pub retried: usize,
    /// Claimed timers dead-lettered by their action.
    pub dead_lettered: usize,
    /// Claimed timers dead-lettered at the attempt ceiling without firing.
    pub attempt_ceiling: usize,
    /// Claimed timers no action owned, scheduled again.
    pub not_mine: usize,
    /// Claimed timers that moved on while firing; their outcome was dropped.
    pub superseded: usize,
    /// Claimed timers whose stored text did not decode: dead-lettered
    /// without firing, with the decode error as the reason.
    pub undecodable: usize,
    /// Stale claims requeued before claiming.
    pub requeued_stuck: u64,
    /// Lapsed foreground resume claims recovered to dead before claiming.
    pub recovered_resumes: u64,
    /// Timers due when the pass began (the backlog gauge).
    pub backlog: u64,
    /// Timers still `firing` under claims taken before the pass began (the stuck gauge).
    pub stuck: u64,
}

impl DrainSummary {
    fn count(&mut self, disposition: &FireDisposition) {
        self.processed += 1;
        match disposition {
            FireDisposition::Fired { .. } => self.fired += 1,
            FireDisposition::RetryScheduled { .. } => self.retried += 1,
            FireDisposition::DeadLettered { .. } => self.dead_lettered += 1,
            FireDisposition::AttemptCeiling { .. } => self.attempt_ceiling += 1,
            FireDisposition::NotMine { .. } => self.not_mine += 1,
            FireDisposition::Superseded { .. } => self.superseded += 1,
        }
    }
}

impl Timers {
    /// Claims and fires at most one due timer: the single testable unit of
    /// the worker.
    ///
    /// First the once-per-pass work: lapsed foreground resume claims go back
    /// to dead, stale `firing` claims are requeued per
    /// [`TimerWorkerOptions::requeue_stuck_after`], and the backlog and stuck
    /// gauges are recorded. Then the earliest due timer is claimed (its
    /// attempts go up by one); past [`TimerWorkerOptions::max_attempts`] it is
    /// dead-lettered without firing, otherwise `fire` runs inside a
    /// `keiro.timer.fire` span and its [`FireOutcome`] is applied. A panic in
    /// `fire` is retried after [`PANIC_RETRY_DELAY`]. Returns `None` when
    /// nothing is due. A claimed timer whose stored text does not decode is
    /// dead-lettered (the reason is the decode error) and returned as
    /// [`TimerError::Payload`].
    ///
    /// Timers are at-least-once: a worker dying between `fire`'s side effect
    /// and the mark, or a `fire` outliving `requeue_stuck_after`, fires the
    /// timer again. Make `fire` idempotent.
    ///
    /// On PostgreSQL, while this process's clock is further off the
    /// server's than [`Timers::max_clock_skew`] allows, nothing is claimed
    /// or requeued and [`TimerError::ClockSkew`] is returned (transient).
    pub async fn run_once<F, Fut>(
        &self,
        options: &TimerWorkerOptions,
        fire: F,
    ) -> Result<Option<FireReport>, TimerError>
    where
        F: Fn(TimerRow) -> Fut,
        Fut: Future<Output = FireOutcome>,
    {
        options.validate()?;
        let now = self.store.now_us();
        self.refuse_if_clock_off().await?;
        self.preamble(options, now, None).await?;
        self.claim_and_fire(options, now, &fire).await
    }

    /// Claims and fires up to `limit` timers that were due when the pass
    /// began, with [`Timers::run_once`]'s semantics for each, and reports
    /// what it did. A timer whose stored text does not decode is
    /// dead-lettered, counted as [`DrainSummary::undecodable`] and logged;
    /// the pass goes on (where `run_once` returns the error).
    ///
    /// The requeue-and-gauge preamble runs once for the whole batch. The pass
    /// stops early when nothing is due, and it cannot spin: every outcome but
    /// completion moves the timer past the pass's start time or out of
    /// `scheduled`, so no timer is claimed twice in one pass. A `limit` of 0
    /// runs only the preamble.
    pub async fn drain<F, Fut>(
        &self,
        options: &TimerWorkerOptions,
        limit: usize,
        fire: F,
    ) -> Result<DrainSummary, TimerError>
    where
        F: Fn(TimerRow) -> Fut,
        Fut: Future<Output = FireOutcome>,
    {
        options.validate()?;
        let now = self.store.now_us();
        self.refuse_if_clock_off().await?;
        let mut summary = self.preamble(options, now, None).await?;
        while summary.processed < limit {
            match self.claim_to_fire(now).await? {
                Some(Ok((timer, lag))) => {
                    let report = self.fire_claimed(options, now, timer, lag, &fire).await?;
                    summary.count(&report.disposition);
                }
                Some(Err(error)) => {
                    // Dead-lettered already: the rest of the batch goes on.
                    tracing::warn!(%error, "keiro timer set aside: its stored text does not decode");
                    summary.processed += 1;
                    summary.undecodable += 1;
                }
                None => break,
            }
        }
        Ok(summary)
    }

    /// Refuses a [`Timers::max_clock_skew`] of zero.
    fn check_clock_limit(&self) -> Result<(), TimerError> {
        if self.clock.limit().is_zero() {
            return Err(TimerError::InvalidOption {
                option: "max_clock_skew",
                reason: "no two clocks agree to the microsecond, so a limit of zero would stop \
                         every claim; use a positive limit (default 2.5 s), or Duration::MAX to \
                         turn the refusal off"
                    .into(),
            });
        }
        Ok(())
    }

    /// Refuses a pass of [`Timers::run_once`] or [`Timers::drain`] while
    /// this process's clock is off the server's, judged after the pass's
    /// `now` was read (see [`Timers::max_clock_skew`]).
    async fn refuse_if_clock_off(&self) -> Result<(), TimerError> {
        self.check_clock_limit()?;
        match self.clock.off_by(&self.store).await {
            Some(off_us) => Err(TimerError::ClockSkew {
                offset_ms: off_us / 1000,
                limit: self.clock.limit(),
            }),
            None => Ok(()),
        }
    }

    /// Recovers lapsed resume claims, requeues stale claims and records the
    /// gauges, as of `now`. Claims taken at or after `own_from` are fires of
    /// this worker still in flight: never requeued, however long they run
    /// (a requeued copy would be claimed by this worker again, and hold a
    /// second slot).
    async fn preamble(
        &self,
        options: &TimerWorkerOptions,
        now: i64,
        own_from: Option<i64>,
    ) -> Result<DrainSummary, TimerError> {
        let recovered_resumes = self.store.recover_expired_timer_resumes(now).await?;
        if recovered_resumes > 0 {
            ::metrics::counter!(metrics::RESUMES_RECOVERED_TOTAL).increment(recovered_resumes);
        }
        let mut requeued_stuck = 0;
        if let Some(ttl) = options.requeue_stuck_after {
            let stale = now.saturating_sub(duration_us(ttl));
            // The requeue takes claims at or before its cutoff.
            let before = own_from.map_or(stale, |own| stale.min(own.saturating_sub(1)));
            requeued_stuck = self.store.requeue_stuck_timers(before).await?;
            if requeued_stuck > 0 {
                tracing::info!(
                    requeued = requeued_stuck,
                    "keiro timer worker requeued stale claims"
                );
                ::metrics::counter!(metrics::REQUEUED_TOTAL).increment(requeued_stuck);
            }
        }
        let backlog = self.store.count_due_timers(now).await?;
        ::metrics::gauge!(metrics::BACKLOG).set(backlog as f64);
        // Claims taken before now and not finished: in flight (here or
        // elsewhere), or stranded by a worker that died.
        let stuck = self
            .store
            .count_stuck_timers(now.saturating_sub(1), None)
            .await?;
        ::metrics::gauge!(metrics::STUCK).set(stuck as f64);
        Ok(DrainSummary {
            requeued_stuck,
            recovered_resumes,
            backlog,
            stuck,
            ..DrainSummary::default()
        })
    }

    /// Claims the earliest timer due at `pass_now` and dead-letters or fires it.
    async fn claim_and_fire<F, Fut>(
        &self,
        options: &TimerWorkerOptions,
        pass_now: i64,
        fire: &F,
    ) -> Result<Option<FireReport>, TimerError>
    where
        F: Fn(TimerRow) -> Fut,
        Fut: Future<Output = FireOutcome>,
    {
        let Some(claimed) = self.claim_to_fire(pass_now).await? else {
            return Ok(None);
        };
        let (timer, lag) = claimed?;
        self.fire_claimed(options, pass_now, timer, lag, fire)
            .await
            .map(Some)
    }

    /// Claims the earliest timer due at `now`: the timer and how late it was
    /// claimed (seconds after its fire time), or `None` when nothing is due;
    /// the outer error is the store's. A timer whose stored text does not
    /// decode is dead-lettered, and the inner error says why.
    async fn claim_to_fire(&self, now: i64) -> Result<Option<Claimed>, TimerError> {
        let Some(record) = self.store.claim_due_timer(now).await? else {
            return Ok(None);
        };
        let claimed_at = self.store.now_us();
        let lag = (claimed_at - record.fire_at).max(0) as f64 / 1e6;
        let id = record.id.clone();
        match TimerRow::from_record(record) {
            Ok(timer) => Ok(Some(Ok((timer, lag)))),
            Err(error) => {
                // Retrying cannot make stored text decode: set it aside.
                self.store
                    .dead_letter_timer(&id, &error.to_string())
                    .await?;
                Ok(Some(Err(error)))
            }
        }
    }

    /// Dead-letters or fires `timer`, claimed `lag` seconds late by a pass
    /// that began at `pass_now`, and applies the outcome.
    async fn fire_claimed<F, Fut>(
        &self,
        options: &TimerWorkerOptions,
        pass_now: i64,
        timer: TimerRow,
        lag: f64,
        fire: &F,
    ) -> Result<FireReport, TimerError>
    where
        F: Fn(TimerRow) -> Fut,
        Fut: Future<Output = FireOutcome>,
    {
        let id = timer.id.to_string();
        let pm = timer.process_manager.clone();
        ::metrics::histogram!(metrics::FIRE_LAG_SECONDS, metrics::LABEL_PROCESS_MANAGER => pm.clone())
            .record(lag);
        ::metrics::histogram!(metrics::ATTEMPTS, metrics::LABEL_PROCESS_MANAGER => pm.clone())
            .record(f64::from(timer.attempts));

        let span = tracing::info_span!(
            "keiro.timer.fire",
            timer.id = %timer.id,
            timer.process_manager = %pm,
            timer.correlation_id = %timer.correlation_id,
            timer.attempts = timer.attempts,
            timer.outcome = tracing::field::Empty,
            timer.reason = tracing::field::Empty,
        );
        let disposition = async {
            if let Some(ceiling) = options.max_attempts {
                if timer.attempts > ceiling {
                    let reason = format!("timer exceeded attempt ceiling of {ceiling}");
                    let update = self.store.dead_letter_timer(&id, &reason).await?;
                    return Ok::<_, TimerError>(applied(update, || {
                        FireDisposition::AttemptCeiling { reason }
                    }));
                }
            }
            let outcome = AssertUnwindSafe(fire(timer.clone()))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| FireOutcome::RetryLater {
                    delay: PANIC_RETRY_DELAY,
                    note: format!("the fire action panicked: {}", panic_message(&*panic)),
                });
            self.apply(&timer, pass_now, outcome).await
        }
        .instrument(span.clone())
        .await?;

        span.record("timer.outcome", disposition.label());
        match &disposition {
            FireDisposition::RetryScheduled { note: reason, .. }
            | FireDisposition::DeadLettered { reason }
            | FireDisposition::AttemptCeiling { reason } => {
                span.record("timer.reason", reason.as_str());
            }
            _ => {}
        }
        span.in_scope(|| match &disposition {
            FireDisposition::DeadLettered { reason }
            | FireDisposition::AttemptCeiling { reason } => {
                tracing::warn!(%reason, "keiro timer dead-lettered")
            }
            FireDisposition::RetryScheduled { note, .. } => {
                tracing::info!(%note, "keiro timer will be retried")
            }
            FireDisposition::Superseded { status } => tracing::info!(
                status = status.map_or("gone", TimerStatus::as_str),
                "keiro timer moved on while firing; its outcome was dropped"
            ),
            _ => tracing::debug!(outcome = disposition.label(), "keiro timer fired"),
        });
        ::metrics::counter!(
            metrics::FIRES_TOTAL,
            metrics::LABEL_PROCESS_MANAGER => pm,
            metrics::LABEL_OUTCOME => disposition.label()
        )
        .increment(1);
        Ok(FireReport { timer, disposition })
    }

    /// Applies a fire action's verdict to the claimed timer's row.
    async fn apply(
        &self,
        timer: &TimerRow,
        pass_now: i64,
        outcome: FireOutcome,
    ) -> Result<FireDisposition, TimerError> {
        let id = timer.id.as_str();
        // A retried timer must land after the pass's start, or the same pass
        // would claim it again.
        let later = |delay: Duration| {
            self.store
                .now_us()
                .saturating_add(duration_us(delay))
                .max(pass_now.saturating_add(1))
        };
        Ok(match outcome {
            FireOutcome::Completed { event_id } => {
                let update = self.store.mark_timer_fired(id, &event_id).await?;
                applied(update, || FireDisposition::Fired { event_id })
            }
            FireOutcome::RetryLater { delay, note } => {
                let at = later(delay);
                let update = self.store.reschedule_timer(id, at, Some(&note)).await?;
                applied(update, || FireDisposition::RetryScheduled {
                    fire_at: from_us(at),
                    note,
                })
            }
            FireOutcome::FailedPermanently { reason } => {
                let update = self.store.dead_letter_timer(id, &reason).await?;
                applied(update, || FireDisposition::DeadLettered { reason })
            }
            FireOutcome::NotMine => {
                let at = later(NOT_MINE_RETRY_DELAY);
                let note = format!(
                    "no fire action handles process manager `{}`",
                    timer.process_manager
                );
                let update = self.store.reschedule_timer(id, at, Some(&note)).await?;
                applied(update, || FireDisposition::NotMine {
                    fire_at: from_us(at),
                })
            }
        })
    }

    /// Starts a worker loop on the current tokio runtime. It claims each due
    /// timer and fires it in a task of its own, up to `options.concurrency`
    /// at once, so a fire action that takes long holds up only itself; it
    /// claims again as soon as a fire ends. When nothing is due it pauses
    /// until the poll interval passes or the earliest scheduled timer is due,
    /// whichever comes first, until [`TimerWorker::shutdown`]. A timer
    /// scheduled during the pause through [`Timers::schedule`] in this
    /// process, or on PostgreSQL in any process (`LISTEN keiro_timers`),
    /// shortens it; one scheduled otherwise waits at most the poll interval.
    /// Before it claims, and again after each `options.batch_size` claims or
    /// poll interval, it runs [`Timers::drain`]'s preamble (the stale-claim
    /// requeue and the gauges). A claim that fails (the store is
    /// unreachable) is logged and retried after the poll interval. The
    /// options are validated first.
    pub fn spawn_worker<F, Fut>(
        &self,
        options: TimerWorkerOptions,
        fire: F,
    ) -> Result<TimerWorker, TimerError>
    where
        F: Fn(TimerRow) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FireOutcome> + Send + 'static,
    {
        options.validate()?;
        self.check_clock_limit()?;
        let (stop, stopped) = watch::channel(false);
        self.wakes.listen(&self.store);
        let timers = self.clone();
        let join = tokio::spawn(timers.worker_loop(options, Arc::new(fire), stopped));
        Ok(TimerWorker { stop, join })
    }

    /// The [`Timers::spawn_worker`] loop.
    async fn worker_loop<F, Fut>(
        self,
        options: TimerWorkerOptions,
        fire: Arc<F>,
        mut stopped: watch::Receiver<bool>,
    ) where
        F: Fn(TimerRow) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FireOutcome> + Send + 'static,
    {
        let mut firing = Firing::default();
        // Claims since the preamble last ran, and when it is due again.
        let (mut since_preamble, mut preamble_at) = (0usize, Instant::now());
        let mut dropped = false;
        let clock = self.clock.clone();
        loop {
            self.wakes.listen(&self.store);
            if dropped || *stopped.borrow() {
                break;
            }
            // While this process's clock is off the server's, neither claims
            // nor the stale-claim requeue (both go by this clock), judged
            // after the requeue's `now` is read, as each claim's is.
            let now = self.store.now_us();
            let mut clock_off = clock.is_off(&self.store).await;
            if !clock_off && (since_preamble >= options.batch_size || Instant::now() >= preamble_at)
            {
                if let Err(error) = self.preamble(&options, now, firing.oldest()).await {
                    tracing::warn!(%error, "keiro timer worker could not requeue stale claims");
                }
                (since_preamble, preamble_at) = (0, Instant::now() + options.poll_interval);
            }
            // Fill the free slots with timers due now.
            let (mut failed, mut claimed) = (false, false);
            while !clock_off && firing.len() < options.concurrency && !*stopped.borrow() {
                let now = self.store.now_us();
                // Judged after each claim's `now` is read: a step of the
                // clock since the last claim counts.
                if clock.is_off(&self.store).await {
                    clock_off = true;
                    break;
                }
                match self.claim_to_fire(now).await {
                    Ok(Some(Ok((timer, lag)))) => {
                        (since_preamble, claimed) = (since_preamble + 1, true);
                        let (timers, fire) = (self.clone(), fire.clone());
                        firing.start(now, async move {
                            timers.fire_claimed(&options, now, timer, lag, &*fire).await
                        });
                    }
                    Ok(Some(Err(error))) => {
                        // Dead-lettered: the next due timer may be claimed.
                        tracing::warn!(%error, "keiro timer set aside: its stored text does not decode");
                        (since_preamble, claimed) = (since_preamble + 1, true);
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(%error, "keiro timer claim failed; retrying after the poll interval");
                        failed = true;
                        break;
                    }
                }
            }
            let full = firing.len() >= options.concurrency;
            // Idle until a fire ends (when every slot is taken), the earliest
            // scheduled timer is due or the poll interval passes. A schedule
            // (in this process, or on PostgreSQL in any) wakes the wait to
            // re-check the earliest fire time.
            let deadline = Instant::now() + options.poll_interval;
            // Whether a wake came since the claims above found nothing.
            let mut woken_since = false;
            loop {
                let woken = self.wakes.timers_notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                let pause = match (full, failed) {
                    _ if clock_off => clock.until_next_reading().min(options.poll_interval),
                    (true, _) => options.poll_interval,
                    (false, true) => deadline.saturating_duration_since(Instant::now()),
                    // Right after finding nothing to claim: see
                    // `idle_after_nothing` (a wake may be a schedule, or a
                    // manual clock moved).
                    (false, false) if !claimed => {
                        idle_after_nothing(self.pause(deadline).await, woken_since)
                    }
                    (false, false) => self.pause(deadline).await,
                };
                if pause.is_zero() {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => break,
                    Some(_) = firing.set.join_next(), if !firing.is_empty() => break,
                    _ = &mut woken, if !full => woken_since = true,
                    changed = stopped.changed() => {
                        // The handle was dropped without a shutdown: stop too.
                        if changed.is_err() {
                            dropped = true;
                        }
                        break;
                    }
                }
            }
        }
        // Shutting down: the fires in flight end and record their outcomes.
        while firing.set.join_next().await.is_some() {}
    }

    /// How long an idle loop may still sleep: until the earliest scheduled
    /// timer is due, at most until `deadline`.
    async fn pause(&self, deadline: Instant) -> Duration {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.store.next_timer_fire_at().await {
            Ok(Some(at)) => until_us(at, self.store.now_us()).min(left),
            _ => left,
        }
    }
}

/// How long a worker whose claims just found nothing waits, when the
/// earliest timer is due in `until_due` (capped at the poll interval's
/// end): never less than [`IDLE_FLOOR`], so a due timer it cannot claim is
/// no busy loop, unless a wake came since (`woken_since`) and a timer is
/// due now: then it claims at once. Wakes coming faster than the floor
/// would otherwise keep such a timer waiting for as long as they come.
fn idle_after_nothing(until_due: Duration, woken_since: bool) -> Duration {
    if until_due.is_zero() && woken_since {
        Duration::ZERO
    } else {
        until_due.max(IDLE_FLOOR)
    }
}

/// The shortest idle wait after claims that found nothing.
const IDLE_FLOOR: Duration = Duration::from_millis(5);

/// The fires a worker loop has in flight, each in a task of its own, and
/// when each was claimed.
#[derive(Default)]
struct Firing {
    set: JoinSet<()>,
    /// Each fire's claim time, with a number of its own (two may share a
    /// time).
    claimed: Arc<Mutex<BTreeSet<(i64, u64)>>>,
    started: u64,
}

impl Firing {
    /// Runs `fire`, a timer claimed at `claimed_at`, in a task of its own.
    fn start(
        &mut self,
        claimed_at: i64,
        fire: impl Future<Output = Result<FireReport, TimerError>> + Send + 'static,
    ) {
        self.started += 1;
        let own = (claimed_at, self.started);
        lock(&self.claimed).insert(own);
        let claimed = self.claimed.clone();
        self.set.spawn(async move {
            let fired = fire.await;
            lock(&claimed).remove(&own);
            if let Err(error) = fired {
                tracing::warn!(%error, "keiro timer fire could not be recorded");
            }
        });
    }

    /// How many are in flight.
    fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether none is.
    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The earliest claim time of a fire in flight: the worker's own claims
    /// from then on are not stale, however long they run.
    fn oldest(&self) -> Option<i64> {
        lock(&self.claimed).first().map(|(at, _)| *at)
    }
}

/// Keeps the disposition when the update applied; otherwise the timer moved on.
fn applied(update: TimerUpdate, disposition: impl FnOnce() -> FireDisposition) -> FireDisposition {
    match update {
        TimerUpdate::Applied(_) => disposition(),
        TimerUpdate::Missing => FireDisposition::Superseded { status: None },
        TimerUpdate::NotApplicable(status) => FireDisposition::Superseded {
            status: Some(status),
        },
        TimerUpdate::Guarded { .. } => FireDisposition::Superseded {
            status: Some(TimerStatus::Resuming),
        },
    }
}

/// A running timer worker loop.
#[derive(Debug)]
pub struct TimerWorker {
    stop: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
}

impl TimerWorker {
    /// Stops claiming, and waits for the timers being fired (if any) and for
    /// the loop to end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.join.await;
    }
}

/// Starts a timer worker loop on the process-wide runtime's store (see
/// [`crate::global`]) with default options, firing due timers through `fire`.
///
/// ```no_run
/// use keiro::timers::{run_timer_worker, FireOutcome, TimerRow};
///
/// # async fn demo() -> Result<(), keiro::Error> {
/// let worker = run_timer_worker(|timer: TimerRow| async move {
///     println!("{} fired for {}", timer.id, timer.correlation_id);
///     FireOutcome::completed(timer.id.to_string())
/// })
/// .await?;
/// // ... until the process should stop:
/// worker.shutdown().await;
/// # Ok(()) }
/// ```
pub async fn run_timer_worker<F, Fut>(fire: F) -> crate::Result<TimerWorker>
where
    F: Fn(TimerRow) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = FireOutcome> + Send + 'static,
{
    let keiro = crate::runtime::global().await?;
    Ok(keiro
        .timers()
        .spawn_worker(TimerWorkerOptions::default(), fire)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_found_due_after_a_wake_is_claimed_at_once() {
        let ms = Duration::from_millis;
        assert_eq!(idle_after_nothing(Duration::ZERO, true), Duration::ZERO);
        assert_eq!(
            idle_after_nothing(Duration::ZERO, false),
            IDLE_FLOOR,
            "a due timer just found unclaimable is no busy loop"
        );
        assert_eq!(idle_after_nothing(ms(1), true), IDLE_FLOOR);
        assert_eq!(idle_after_nothing(ms(300), true), ms(300));
        assert_eq!(idle_after_nothing(ms(300), false), ms(300));
    }
}
