//! Durable timers for process managers: wake me at a future time, even if
//! every process restarts in between.
//!
//! A process manager (a saga, a reminder flow, a retry policy) schedules a
//! timer, typically inside the same transaction that records its own state
//! ([`schedule_tx`]); a worker claims each timer once it is due, hands it to
//! the application's fire action and applies the [`FireOutcome`] the action
//! returns. Timers are stored in the keiro database (`keiro_timers` on SQLite,
//! `keiro.timers` on PostgreSQL), so any number of worker processes can share
//! them: on PostgreSQL claims use `FOR UPDATE SKIP LOCKED`.
//!
//! ```no_run
//! use std::time::Duration;
//! use keiro::timers::{FireOutcome, TimerRequest, TimerRow, TimerWorkerOptions};
//!
//! # async fn demo() -> Result<(), keiro::Error> {
//! let keiro = keiro::Keiro::connect("sqlite:keiro.db").await?;
//! let timers = keiro.timers();
//!
//! // Schedule: idempotent on the id.
//! timers
//!     .schedule(
//!         &TimerRequest::after("order-42/timeout", "checkout", "order-42", Duration::from_secs(900))
//!             .payload(serde_json::json!({ "reason": "payment not received" })),
//!     )
//!     .await?;
//!
//! // Fire: a long-running loop (or `timers.drain(..)` for one batch).
//! let worker = timers.spawn_worker(
//!     TimerWorkerOptions::default().max_attempts(8),
//!     |timer: TimerRow| async move {
//!         match timer.process_manager.as_str() {
//!             "checkout" => FireOutcome::completed(format!("cancelled:{}", timer.correlation_id)),
//!             _ => FireOutcome::NotMine,
//!         }
//!     },
//! )?;
//! worker.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! * **At-least-once.** A worker that dies mid-fire leaves its timer `firing`;
//!   the next pass of any worker requeues it once the claim is older than
//!   [`TimerWorkerOptions::requeue_stuck_after`] (default 300 s), and it fires
//!   again. Fire actions must be idempotent.
//! * **Outcomes.** [`FireOutcome::Completed`] marks the timer fired with the
//!   event id it produced; [`FireOutcome::RetryLater`] reschedules the claimed
//!   timer in one statement; [`FireOutcome::FailedPermanently`] dead-letters
//!   it; [`FireOutcome::NotMine`] offers it again after
//!   [`NOT_MINE_RETRY_DELAY`]. [`TimerWorkerOptions::max_attempts`]
//!   dead-letters a timer that keeps coming back.
//! * **Recovery and inspection.** [`Timers::pending`], [`Timers::stuck`] and
//!   [`Timers::dead`] page through timers with filters and opaque cursors;
//!   [`Timers::requeue`], [`Timers::reschedule`], [`Timers::cancel`] and
//!   [`Timers::dead_letter`] move one timer by id.
//! * **Guarded resume.** [`Timers::claim_dead`] takes a dead timer under an
//!   expiring, token-guarded claim for foreground work (see
//!   [`TimerResumeClaim`]); id-only mutations refuse a timer so held.
//! * **Observability.** A `keiro.timer.fire` span per fire names the timer;
//!   fire lag, attempts, backlog, stuck claims and requeues are recorded
//!   through the `metrics` facade (see [`metrics`]), labelled
//!   only by process manager and outcome.

mod clock_guard;
mod error;
mod inspect;
pub mod metrics;
mod resume;
mod types;
mod worker;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keiro_store::{NewTimer, Store, StoreOptions, TimerUpdate};

pub use error::TimerError;
pub use inspect::{
    TimerFilter, TimerList, TimerPage, TimerPageRequest, TimerReasonFilter, MAX_PAGE_LIMIT,
};
pub use keiro_store::{ScheduleOutcome, TimerStatus, TimerTx};
pub use resume::{TimerResumeClaim, MAX_RESUME_LEASE};
pub use types::{TimerAction, TimerChange, TimerId, TimerRequest, TimerRow};
pub use worker::{
    run_timer_worker, DrainSummary, FireDisposition, FireOutcome, FireReport, TimerWorker,
    TimerWorkerOptions, NOT_MINE_RETRY_DELAY, PANIC_RETRY_DELAY,
};

use crate::runtime::listener::Wakes;
use crate::time::{duration_us, from_us, to_us};
pub(crate) use clock_guard::ClockGuard;

/// The timer API over one store. Cheap to clone.
///
/// Get one from a runtime with [`crate::Keiro::timers`], or from a bare
/// [`Store`] with [`Timers::new`] (a worker process that runs no workflows
/// needs nothing else).
#[derive(Debug, Clone)]
pub struct Timers {
    store: Store,
    /// Wakes idle worker loops on this database in this process.
    wakes: Arc<Wakes>,
    /// The largest payload a timer may carry, in bytes.
    max_payload_bytes: usize,
    /// The verdict on this process's clock of the loops and calls of this
    /// value and its clones (the runtime's, for [`crate::Keiro::timers`]),
    /// with the skew it allows ([`Timers::max_clock_skew`]).
    clock: Arc<ClockGuard>,
}

/// [`Timers::max_clock_skew`]'s default: a quarter of the runtime's default
/// lease TTL, the runtime's own default limit.
pub const DEFAULT_TIMER_MAX_CLOCK_SKEW: Duration = Duration::from_millis(2_500);

impl crate::Keiro {
    /// The timers stored alongside this runtime's journal, with its payload
    /// and clock-skew limits.
    pub fn timers(&self) -> Timers {
        let mut timers =
            Timers::new(self.raw_store().clone()).max_payload_bytes(self.max_payload_bytes());
        // One reading of the clock for every `Timers` of this runtime.
        timers.clock = self.timer_clock();
        timers
    }
}

impl Timers {
    /// Timers in `store`.
    pub fn new(store: Store) -> Timers {
        metrics::describe();
        let wakes = Wakes::of(&store);
        Timers {
            store,
            wakes,
            max_payload_bytes: crate::DEFAULT_MAX_PAYLOAD_BYTES,
            clock: Arc::new(ClockGuard::new(DEFAULT_TIMER_MAX_CLOCK_SKEW)),
        }
    }

    /// How far the clock of a [`Timers::spawn_worker`] loop may be off the
    /// database server's (PostgreSQL): the loop reads the server's clock
    /// every 2.5 s and, while its own is further off, claims no timer and
    /// requeues no stale claim (an error is logged when it stops, an info
    /// line when it resumes), since timers fall due by the claiming worker's
    /// clock. Default [`DEFAULT_TIMER_MAX_CLOCK_SKEW`]; the runtime's
    /// `max_clock_skew` for [`crate::Keiro::timers`]; `Duration::MAX` turns
    /// the refusal off (nothing is read then). [`Timers::run_once`] and
    /// [`Timers::drain`], called by the application's own loop, read it as
    /// often and, while it is off, claim nothing and return
    /// [`TimerError::ClockSkew`]. A `Timers`, its clones and their loops
    /// share one reading, and so do all the `Timers` one runtime hands out
    /// ([`crate::Keiro::timers`]) while their limit is the runtime's; a
    /// different limit starts a reading of its own. A limit of zero is refused with
    /// [`TimerError::InvalidOption`] by all three. SQLite's database is a
    /// file on this host: there is no second clock.
    pub fn max_clock_skew(mut self, skew: Duration) -> Timers {
        // The same limit keeps the reading it shares (a runtime's).
        if self.clock.limit() != skew {
            self.clock = Arc::new(ClockGuard::new(skew));
        }
        self
    }

    /// Refuses a payload longer than `bytes` when scheduling, with
    /// [`TimerError::PayloadTooLarge`] and nothing written (default
    /// [`crate::DEFAULT_MAX_PAYLOAD_BYTES`]; the runtime's limit for
    /// [`crate::Keiro::timers`]).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Timers {
        self.max_payload_bytes = bytes;
        self
    }

    /// Connects to `url` (`sqlite:path`, `postgres://…`), runs the migrations
    /// and returns its timers.
    pub async fn connect(url: &str) -> Result<Timers, TimerError> {
        Ok(Timers::new(
            Store::connect(url, &StoreOptions::default()).await?,
        ))
    }

    /// A read-only view of the underlying store (raw access for tests and
    /// tools: [`crate::unstable::raw_timer_store`]).
    pub fn store(&self) -> crate::inspect::StoreView<'_> {
        crate::inspect::StoreView::new(&self.store)
    }

    /// The raw store, for [`crate::unstable::raw_timer_store`].
    pub(crate) fn raw(&self) -> &Store {
        &self.store
    }

    /// Schedules a timer: a new id is recorded ([`ScheduleOutcome::Created`]);
    /// a timer with this id still waiting to fire is moved to the request's
    /// fire time, payload, process manager and correlation id, keeping its
    /// attempts ([`ScheduleOutcome::Updated`]); one already firing, fired,
    /// dead or cancelled is left alone ([`ScheduleOutcome::Unchanged`]).
    pub async fn schedule(&self, request: &TimerRequest) -> Result<ScheduleOutcome, TimerError> {
        let payload = encode(request, self.max_payload_bytes)?;
        let outcome = self
            .store
            .schedule_timer(&new_timer(request, &payload))
            .await?;
        self.wakes.timers_changed();
        Ok(outcome)
    }

    /// Schedules a timer unless one with its id exists in any state: the
    /// first schedule wins. Returns whether this call created it.
    pub async fn schedule_once(&self, request: &TimerRequest) -> Result<bool, TimerError> {
        let payload = encode(request, self.max_payload_bytes)?;
        let created = self
            .store
            .schedule_timer_once(&new_timer(request, &payload))
            .await?;
        self.wakes.timers_changed();
        Ok(created)
    }

    /// Reads one timer.
    pub async fn get(&self, id: &TimerId) -> Result<Option<TimerRow>, TimerError> {
        self.store
            .get_timer(id.as_str())
            .await?
            .map(TimerRow::from_record)
            .transpose()
    }

    /// Claims the earliest timer due now for the caller to fire (a worker does
    /// this for you): it becomes `firing` and its attempts go up by one.
    /// Finish it with [`Timers::mark_fired`], [`Timers::reschedule`] or
    /// [`Timers::dead_letter`].
    pub async fn claim_due(&self) -> Result<Option<TimerRow>, TimerError> {
        self.store
            .claim_due_timer(self.store.now_us())
            .await?
            .map(TimerRow::from_record)
            .transpose()
    }

    /// Marks a `firing` timer fired with the id of the event its firing produced.
    pub async fn mark_fired(
        &self,
        id: &TimerId,
        event_id: &str,
    ) -> Result<TimerChange, TimerError> {
        change(
            id,
            self.store.mark_timer_fired(id.as_str(), event_id).await?,
        )
    }

    /// How many timers are due now and not yet claimed.
    pub async fn count_due(&self) -> Result<u64, TimerError> {
        Ok(self.store.count_due_timers(self.store.now_us()).await?)
    }

    /// How many timers are `firing` under a claim taken at least `older_than`
    /// ago, optionally only one process manager's.
    pub async fn count_stuck(
        &self,
        older_than: Duration,
        process_manager: Option<&str>,
    ) -> Result<u64, TimerError> {
        let claimed_by = self.store.now_us().saturating_sub(duration_us(older_than));
        Ok(self
            .store
            .count_stuck_timers(claimed_by, process_manager)
            .await?)
    }

    /// Moves every timer claimed at least `older_than` ago and still `firing`
    /// back to `scheduled`, keeping fire time and attempts. Returns how many.
    pub async fn requeue_stuck(&self, older_than: Duration) -> Result<u64, TimerError> {
        let claimed_by = self.store.now_us().saturating_sub(duration_us(older_than));
        Ok(self.store.requeue_stuck_timers(claimed_by).await?)
    }

    /// Puts one timer back in line at its fire time: a `firing` one keeps its
    /// attempts; a `dead` one starts over with zero attempts (its reason is
    /// kept for the record).
    pub async fn requeue(&self, id: &TimerId) -> Result<TimerChange, TimerError> {
        let update = self.store.requeue_timer(id.as_str()).await?;
        self.wakes.timers_changed();
        change(id, update)
    }

    /// Moves a claimed (`firing`) or `scheduled` timer to `fire_at` in one
    /// statement, keeping its attempts, with `note` as its latest diagnostic
    /// when given.
    pub async fn reschedule(
        &self,
        id: &TimerId,
        fire_at: SystemTime,
        note: Option<&str>,
    ) -> Result<TimerChange, TimerError> {
        let update = self
            .store
            .reschedule_timer(id.as_str(), to_us(fire_at), note)
            .await?;
        self.wakes.timers_changed();
        change(id, update)
    }

    /// Cancels a `scheduled`, `firing` or `dead` timer.
    pub async fn cancel(&self, id: &TimerId) -> Result<TimerChange, TimerError> {
        change(id, self.store.cancel_timer(id.as_str()).await?)
    }

    /// Dead-letters a `scheduled` or `firing` timer with `reason`, keeping its
    /// attempts. It stays dead until requeued, resumed or cancelled.
    pub async fn dead_letter(&self, id: &TimerId, reason: &str) -> Result<TimerChange, TimerError> {
        change(id, self.store.dead_letter_timer(id.as_str(), reason).await?)
    }
}

/// Schedules a timer inside the caller's own transaction (SQLite or
/// PostgreSQL, see [`TimerTx`]): the timer exists exactly when that
/// transaction commits, and committing stays the caller's job. Same
/// semantics as [`Timers::schedule`]. On PostgreSQL the commit wakes idle
/// workers in every process; on SQLite a worker notices the timer at its next
/// poll (or sooner, when another timer is due first).
///
/// ```no_run
/// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use keiro::timers::{schedule_tx, TimerRequest};
///
/// let Some(pool) = keiro.store().postgres_pool() else { return Ok(()) };
/// let mut tx = pool.begin().await?;
/// // ... the process manager's own writes ...
/// schedule_tx(&mut tx, &TimerRequest::after("saga-7/deadline", "saga", "saga-7", Duration::from_secs(60))).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn schedule_tx<'t, 'c: 't>(
    tx: impl Into<TimerTx<'t, 'c>>,
    request: &TimerRequest,
) -> Result<ScheduleOutcome, TimerError> {
    let limit = crate::json::global_payload_limit();
    schedule_tx_at(tx, request, limit, global_now_us()).await
}

/// Schedules a timer inside the caller's own transaction unless one with its
/// id exists in any state. Returns whether this call created it.
pub async fn schedule_once_tx<'t, 'c: 't>(
    tx: impl Into<TimerTx<'t, 'c>>,
    request: &TimerRequest,
) -> Result<bool, TimerError> {
    let limit = crate::json::global_payload_limit();
    schedule_once_tx_at(tx, request, limit, global_now_us()).await
}

/// Cancels a `scheduled`, `firing` or `dead` timer inside the caller's own
/// transaction.
pub async fn cancel_tx<'t, 'c: 't>(
    tx: impl Into<TimerTx<'t, 'c>>,
    id: &TimerId,
) -> Result<TimerChange, TimerError> {
    cancel_tx_at(tx, id, global_now_us()).await
}

/// Now by the process-wide runtime's clock (a [`TestEnv`]'s virtual one)
/// when one is set up, else the system clock: the stamp of the free
/// functions' writes. [`Timers`]' own `_tx` methods use their store's.
///
/// [`TestEnv`]: crate::testing::TestEnv
fn global_now_us() -> i64 {
    crate::runtime::try_global().map_or_else(keiro_store::now_us, |keiro| keiro.now_us())
}

/// [`schedule_tx`] with its payload held to `limit` bytes, stamped at `now`.
async fn schedule_tx_at<'t, 'c: 't>(
    tx: impl Into<TimerTx<'t, 'c>>,
    request: &TimerRequest,
    limit: usize,
    now: i64,
) -> Result<ScheduleOutcome, TimerError> {
    let payload = encode(request, limit)?;
    let timer = new_timer(request, &payload);
    Ok(keiro_store::schedule_timer_tx(tx, &timer, now).await?)
}

/// [`schedule_once_tx`] with its payload held to `limit` bytes, stamped at
/// `now`.
async fn schedule_once_tx_at<'t, 'c: 't>(
    tx: impl Into<TimerTx<'t, 'c>>,
    request: &TimerRequest,
    limit: usize,
    now: i64,
) -> Result<bool, TimerError> {
    let payload = encode(request, limit)?;
    let timer = new_timer(request, &payload);
    Ok(keiro_store::schedule_timer_once_tx(tx, &timer, now).await?)
}

/// [`cancel_tx`] stamped at `now`.
async fn cancel_tx_at<'t, 'c: 't>(
    tx: impl Into<TimerTx<'t, 'c>>,
    id: &TimerId,
    now: i64,
) -> Result<TimerChange, TimerError> {
    change(
        id,
        keiro_store::cancel_timer_tx(tx, id.as_str(), now).await?,
    )
}

impl Timers {
    /// [`schedule_tx`] stamped by this store's clock (a
    /// [`TestEnv`](crate::testing::TestEnv)'s virtual one) and held to this
    /// handle's payload limit.
    pub async fn schedule_tx<'t, 'c: 't>(
        &self,
        tx: impl Into<TimerTx<'t, 'c>>,
        request: &TimerRequest,
    ) -> Result<ScheduleOutcome, TimerError> {
        schedule_tx_at(tx, request, self.max_payload_bytes, self.store.now_us()).await
    }

    /// [`schedule_once_tx`] stamped by this store's clock and held to this
    /// handle's payload limit.
    pub async fn schedule_once_tx<'t, 'c: 't>(
        &self,
        tx: impl Into<TimerTx<'t, 'c>>,
        request: &TimerRequest,
    ) -> Result<bool, TimerError> {
        schedule_once_tx_at(tx, request, self.max_payload_bytes, self.store.now_us()).await
    }

    /// [`cancel_tx`] stamped by this store's clock.
    pub async fn cancel_tx<'t, 'c: 't>(
        &self,
        tx: impl Into<TimerTx<'t, 'c>>,
        id: &TimerId,
    ) -> Result<TimerChange, TimerError> {
        cancel_tx_at(tx, id, self.store.now_us()).await
    }
}

/// `request`'s payload as stored, refused when invalid or over `limit` bytes.
fn encode(request: &TimerRequest, limit: usize) -> Result<String, TimerError> {
    request.validate()?;
    // A `serde_json::Value` holds no NaN, but may nest deeper than it reads back.
    let payload = crate::json::to_json(&request.payload, || {
        format!("the payload of timer `{}` holds", request.id)
    })
    .map_err(|error| TimerError::InvalidRequest {
        id: request.id.to_string(),
        reason: error.to_string(),
    })?;
    if payload.len() > limit {
        return Err(TimerError::PayloadTooLarge {
            id: request.id.to_string(),
            process_manager: request.process_manager.clone(),
            size: payload.len(),
            limit,
        });
    }
    Ok(payload)
}

fn new_timer<'a>(request: &'a TimerRequest, payload: &'a str) -> NewTimer<'a> {
    NewTimer {
        id: request.id.as_str(),
        process_manager: &request.process_manager,
        correlation_id: &request.correlation_id,
        fire_at: to_us(request.fire_at),
        payload,
    }
}

fn change(id: &TimerId, update: TimerUpdate) -> Result<TimerChange, TimerError> {
    match update {
        TimerUpdate::Applied(record) => Ok(TimerChange::Applied(TimerRow::from_record(record)?)),
        TimerUpdate::Missing => Ok(TimerChange::NotFound),
        TimerUpdate::NotApplicable(status) => Ok(TimerChange::NotApplicable(status)),
        TimerUpdate::Guarded { lease_until } => Err(TimerError::HeldForResume {
            id: id.to_string(),
            lease_until: from_us(lease_until),
        }),
    }
}
