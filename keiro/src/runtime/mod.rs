//! The runtime handle, [`Keiro`]: a connected store, its journal writer, the
//! registry, this process's executor identity, and what it has in flight.
//!
//! * `builder.rs`: [`KeiroBuilder`] and [`Keiro::connect`].
//! * `global.rs`: the process-wide default ([`init`], [`global`],
//!   [`Keiro::from_env`]) and the environment variables it reads.
//! * `identity.rs`: taking and keeping this process's executor identity.
//! * `inflight.rs`: the instances this process drives, their live runs and
//!   who waits on them, behind one lock.
//! * `listener.rs`: wake-ups per database, and on PostgreSQL the one listener
//!   connection per database and process.
//!
//! `Inner` is private to this module: the rest of the crate uses `Keiro`'s
//! methods.

mod builder;
pub(crate) mod clock_check;
mod global;
pub(crate) mod identity;
pub(crate) mod inflight;
pub(crate) mod listener;

use std::sync::Arc;
use std::time::Duration;

use keiro_store::{JournalWriter, Store};
use tokio::sync::{watch, Notify, OnceCell};

use crate::registry::Registry;
use inflight::{InFlight, Waiter};
use listener::Wakes;

pub use builder::{KeiroBuilder, DEFAULT_MAX_PAYLOAD_BYTES};
pub(crate) use global::try_global;
pub use global::{
    global, init, DATABASE_URL_ENV, DEFAULT_DATABASE_URL, EXECUTOR_ID_ENV, LISTEN_URL_ENV,
    SQLITE_SYNCHRONOUS_ENV,
};

/// A connected keiro runtime. Cheap to clone; every clone shares one store,
/// one journal writer and one registry.
#[derive(Clone)]
pub struct Keiro {
    inner: Arc<Inner>,
}

/// What every clone of one runtime shares. Private to the runtime: the rest
/// of the crate goes through `Keiro`'s methods.
struct Inner {
    store: Store,
    writer: JournalWriter,
    registry: Registry,
    /// This runtime's application version and the compatible ones.
    versions: crate::version::AppVersions,
    /// The identity asked for: explicit (exclusive) or the default base.
    requested_id: String,
    /// Whether `requested_id` was set explicitly, so no other is taken.
    exclusive: bool,
    lease_ttl: Duration,
    /// This process's clock against the database server's, with the skew
    /// allowed (`KeiroBuilder::max_clock_skew`; see [`clock_check`]).
    clock: clock_check::ClockVerdict,
    /// The verdict on the clock of every [`crate::timers::Timers`] this
    /// runtime hands out, and of their loops.
    timer_clock: Arc<crate::timers::ClockGuard>,
    max_attempts: u32,
    /// Waits longer than this suspend the workflow instead of holding memory.
    suspend_after: Duration,
    /// How workflows that do not say journal their steps.
    journal: crate::Journal,
    /// How long a caller waits on a due instance that no live worker serves
    /// before `result()` says so.
    no_worker_timeout: Duration,
    /// The largest encoded value written (`KeiroBuilder::max_payload_bytes`).
    max_payload_bytes: usize,
    /// Set once this process's resume worker has recorded the workflow names
    /// it serves.
    serving: OnceCell<()>,
    /// The identity this runtime took, once it runs workflows; read through
    /// [`Keiro::owner`].
    executor: OnceCell<identity::Registration>,
    /// Set by [`Keiro::shutdown`]: in-process runs, workers and the heartbeat
    /// stop.
    stop: watch::Sender<bool>,
    /// Wakes this process's resume worker (work was enqueued here, or a
    /// notification arrived).
    wake: Arc<Notify>,
    /// The instances this process drives, their live runs and their waiters.
    inflight: Arc<InFlight>,
    /// The wake-ups of this runtime's database, shared in this process.
    wakes: Arc<Wakes>,
    /// This process's cron schedulers: their wake-up and progress.
    schedulers: Arc<crate::schedule::scheduler::SchedulerState>,
    /// The order this process's resume passes claim their sources in.
    claim_turns: crate::resume::ClaimTurns,
}

impl std::fmt::Debug for Keiro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keiro")
            .field("backend", &self.inner.store.backend())
            .field("executor_id", &self.owner())
            .finish_non_exhaustive()
    }
}

impl Keiro {
    /// A read-only view of the store this runtime journals into (raw access
    /// for tests and tools: [`crate::unstable::raw_store`]).
    pub fn store(&self) -> crate::inspect::StoreView<'_> {
        crate::inspect::StoreView::new(&self.inner.store)
    }

    /// The store with every mutator, for keiro's own calls (which keep its
    /// invariants) and [`crate::unstable::raw_store`].
    pub(crate) fn raw_store(&self) -> &Store {
        &self.inner.store
    }

    /// This runtime's executor identity, the owner name on its leases: the
    /// one it took when it first ran a workflow (a default identity may carry
    /// a `#N` suffix), or before that, the one it will ask for first.
    pub fn executor_id(&self) -> &str {
        self.owner()
    }

    /// The names of the workflows linked into this binary, sorted.
    pub fn workflow_names(&self) -> Vec<&'static str> {
        self.inner.registry.names()
    }

    /// The clock durable time is read from (the store's).
    pub(crate) fn clock(&self) -> &keiro_store::Clock {
        self.inner.store.clock()
    }

    /// Now by [`Keiro::clock`], in µs since the Unix epoch.
    pub(crate) fn now_us(&self) -> i64 {
        self.inner.store.now_us()
    }

    /// The group-commit writer every journal write of this runtime goes through.
    pub(crate) fn writer(&self) -> &JournalWriter {
        &self.inner.writer
    }

    /// The workflows linked into this binary.
    pub(crate) fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// This runtime's application version and the compatible ones.
    pub(crate) fn versions(&self) -> &crate::version::AppVersions {
        &self.inner.versions
    }

    /// The instances this process drives, their live runs and their waiters.
    pub(crate) fn inflight(&self) -> &InFlight {
        &self.inner.inflight
    }

    /// Registers a waiter for steps recorded for (or the end of) instance
    /// `id`, listening for recordings in other processes where the store can
    /// tell.
    pub(crate) fn waiter(&self, id: &str) -> Waiter {
        self.listen_for_wakes();
        self.inner.inflight.wait(id)
    }

    /// On PostgreSQL, makes sure (once per database and process) that
    /// recordings and enqueues in other processes wake this one.
    pub(crate) fn listen_for_wakes(&self) {
        self.inner.wakes.listen(&self.inner.store);
    }

    /// Tells this process's waiters on instance `id` that a step was recorded
    /// for it.
    pub(crate) fn step_recorded(&self, id: &str) {
        self.inner.inflight.notify(id);
    }

    /// How long a claim on an instance run here lasts without renewal.
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.inner.lease_ttl
    }

    /// The largest encoded value this runtime writes, in bytes.
    pub(crate) fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes
    }

    /// How many crashes an instance run here may have before it is failed.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.inner.max_attempts
    }

    /// Waits longer than this suspend a workflow instead of holding memory.
    pub(crate) fn suspend_after(&self) -> Duration {
        self.inner.suspend_after
    }

    /// How workflow `name` journals its steps: as it says, else as this
    /// runtime's default.
    pub(crate) fn journal_of(&self, name: &str) -> crate::Journal {
        self.registry()
            .get(name)
            .and_then(|registration| registration.journal)
            .unwrap_or(self.inner.journal)
    }

    /// How long a caller waits on an instance no live worker serves.
    pub(crate) fn no_worker_timeout(&self) -> Duration {
        self.inner.no_worker_timeout
    }

    /// Set once this process's resume worker recorded the names it serves.
    pub(crate) fn serving(&self) -> &OnceCell<()> {
        &self.inner.serving
    }

    /// Wakes this process's resume worker now.
    pub(crate) fn wake_resume_worker(&self) {
        self.inner.wake.notify_one();
    }

    /// Wakes this process's resume worker and, on PostgreSQL, every other
    /// process's, after `what` (e.g. "an enqueue") committed work for them.
    /// A lost notification only costs latency (workers poll): logged, never
    /// an error.
    pub(crate) async fn wake_all_workers(&self, what: &str) {
        self.wake_resume_worker();
        if let Err(error) = self.raw_store().wake_workers("").await {
            tracing::warn!(%error, "keiro could not notify workers of {what}");
        }
    }

    /// Wakes the idle timer worker loops on this runtime's database.
    #[cfg(feature = "sqlite")]
    pub(crate) fn wake_timer_workers(&self) {
        self.inner.wakes.timers_changed();
    }

    /// What wakes this process's resume worker.
    /// What this runtime's cron schedulers share with it.
    pub(crate) fn scheduler_state(&self) -> &crate::schedule::scheduler::SchedulerState {
        &self.inner.schedulers
    }

    /// The order this process's resume passes claim their sources in.
    pub(crate) fn claim_turns(&self) -> &crate::resume::ClaimTurns {
        &self.inner.claim_turns
    }

    pub(crate) fn resume_wake(&self) -> &Notify {
        &self.inner.wake
    }

    /// Follows this runtime's shutdown signal.
    pub(crate) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.inner.stop.subscribe()
    }

    /// Raises the shutdown signal; `false` when it was raised already.
    pub(crate) fn signal_stop(&self) -> bool {
        !self.inner.stop.send_replace(true)
    }

    /// The identity this runtime took, if it took one.
    pub(crate) fn registration(&self) -> Option<&identity::Registration> {
        self.inner.executor.get()
    }
}

/// Locks `m`, carrying on past a panic of an earlier holder: every state
/// behind these locks stays consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
