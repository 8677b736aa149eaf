//! [`TestEnv`]: a runtime on a private in-memory database with a virtual
//! clock, so a workflow that waits for days is tested in milliseconds.

use std::time::{Duration, Instant, SystemTime};

use keiro_store::Clock;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{Keiro, Result, ResumeOptions, ResumeWorker, WorkflowCall, WorkflowHandle};

/// How long [`TestEnv::advance`] waits in real time for the runtime to settle
/// (every due instance run, every due timer fired) before it gives up and
/// panics naming what is still due.
const STALL_LIMIT: Duration = Duration::from_secs(30);

/// How often a settling [`TestEnv`] looks at the store and its runs.
const SETTLE_POLL: Duration = Duration::from_millis(1);

/// An isolated keiro runtime for tests: a private in-memory SQLite database
/// (one per environment, so tests running in parallel share nothing), a
/// resume worker, and a virtual clock that starts at the real current time
/// and moves only through [`TestEnv::advance`] (or [`TestEnv::run`]).
///
/// Every durable time of this runtime reads the virtual clock: `keiro::now`,
/// [`keiro::sleep`](crate::sleep) and [`keiro::sleep_until`](crate::sleep_until)
/// deadlines, `recv` and awakeable timeouts, workflow deadlines
/// ([`WorkflowCall::timeout`]), crash backoffs, and timers (give them fire
/// times from [`TestEnv::now`]). Waits never hold real time: the runtime's
/// `suspend_after` is zero, so every wait suspends its workflow to the store
/// at once, and `advance` wakes what falls due.
///
/// ```no_run
/// use std::time::Duration;
/// use keiro::testing::TestEnv;
///
/// #[keiro::workflow]
/// async fn approval(order: String) -> Result<String, String> {
///     keiro::sleep(Duration::from_secs(3 * 86_400)).await;
///     let answer = keiro::recv::<bool>("approved")
///         .timeout(Duration::from_secs(86_400))
///         .await
///         .map_err(|e| e.to_string())?;
///     Ok(match answer {
///         Some(true) => format!("{order} approved"),
///         _ => format!("{order} expired"),
///     })
/// }
///
/// # async fn demo() -> Result<(), keiro::Error> {
/// let env = TestEnv::new().await;
/// let handle = env.start(approval("order-42".into()).id("order-42")).await?;
/// env.advance(Duration::from_secs(3 * 86_400)).await; // the sleep ends
/// env.advance(Duration::from_secs(86_400)).await; // the recv times out
/// assert_eq!(handle.result().await?, Ok("order-42 expired".to_owned()));
/// # Ok(()) }
/// ```
pub struct TestEnv {
    keiro: Keiro,
    clock: Clock,
    /// Kept so the worker runs as long as the environment.
    _worker: ResumeWorker,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}

impl TestEnv {
    /// A new environment: its own in-memory SQLite database, migrated, with a
    /// resume worker serving every workflow linked into the test binary, and
    /// a virtual clock reading the real current time.
    ///
    /// # Panics
    ///
    /// When the in-memory database cannot be opened or the resume worker
    /// cannot start (a bug, not a test failure): a test has nothing to do
    /// with such an error but stop, so it panics saying why.
    pub async fn new() -> TestEnv {
        TestEnv::starting_at(SystemTime::now()).await
    }

    /// Like [`TestEnv::new`], with the virtual clock starting at `start`
    /// (a fixed epoch makes recorded times reproducible).
    ///
    /// # Panics
    ///
    /// As [`TestEnv::new`].
    pub async fn starting_at(start: SystemTime) -> TestEnv {
        let clock = Clock::manual(start);
        let keiro = Keiro::builder(private_database_url())
            .clock(clock.clone())
            .suspend_after(Duration::ZERO)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("keiro TestEnv: cannot open an in-memory database: {e}"));
        let worker = keiro
            .resume_worker(ResumeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("keiro TestEnv: cannot start the resume worker: {e}"));
        TestEnv {
            keiro,
            clock,
            _worker: worker,
        }
    }

    /// The runtime, for everything else: sending messages, resolving
    /// awakeables, handles, timers (`keiro().timers()`), inspection.
    pub fn keiro(&self) -> &Keiro {
        &self.keiro
    }

    /// The virtual time now.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Starts `call` in the background on this environment's runtime; it runs
    /// until it ends or waits (every wait suspends it at once).
    pub async fn start<R>(&self, call: WorkflowCall<R>) -> Result<WorkflowHandle<R>>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        call.on(&self.keiro).start().await
    }

    /// Runs `call` to its result, skipping time: whenever nothing is left to
    /// run now and the workflow has not ended, the clock moves to the next
    /// wake time (a sleep's deadline, a timeout, a timer), as
    /// [`TestEnv::advance`] would. With nothing scheduled (the workflow waits
    /// for a message or an awakeable only), it waits in real time for another
    /// task to send it.
    ///
    /// # Panics
    ///
    /// As [`TestEnv::advance`].
    pub async fn run<R>(&self, call: WorkflowCall<R>) -> Result<R>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        let handle = self.start(call).await?;
        loop {
            self.settle().await;
            if handle.status().await?.is_final() {
                return handle.result().await;
            }
            match self.next_due().await {
                Some(at) if at > self.clock.now_us() => {
                    self.clock.set_us(at);
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// Moves the virtual clock forward by `by`, making everything that falls
    /// due within it happen, in time order, without waiting: it repeatedly
    /// moves the clock to the earliest wake time up to the target (a
    /// suspended instance's sleep, timeout or deadline; a timer's fire time;
    /// a cron tick of a schedule whose workflow the test binary links),
    /// wakes the resume worker, cron scheduler and timer workers, and waits
    /// until nothing is running and nothing is due before moving on. The clock ends exactly
    /// `by` later than it started.
    ///
    /// Timers fire only through a timer worker the test runs on
    /// [`TestEnv::keiro`] (`env.keiro().timers().spawn_worker(..)`).
    ///
    /// # Panics
    ///
    /// When the runtime does not settle within 30 s of real time (an instance
    /// of a workflow this binary does not link stays due; a timer is due and
    /// no timer worker fires it; a step runs that long), naming what is still
    /// due, or when the store fails.
    pub async fn advance(&self, by: Duration) {
        let target = self
            .clock
            .now_us()
            .saturating_add(crate::time::duration_us(by));
        loop {
            self.settle().await;
            match self.next_due().await {
                Some(at) if at > self.clock.now_us() && at <= target => {
                    self.clock.set_us(at);
                }
                _ => break,
            }
        }
        self.clock.set_us(target);
        self.settle().await;
    }

    /// The earliest wake time of an unfinished instance, a scheduled timer
    /// or a cron tick.
    async fn next_due(&self) -> Option<i64> {
        let store = self.keiro.raw_store();
        let wake = store
            .next_wake_at()
            .await
            .unwrap_or_else(|e| store_failed(e));
        let fire = store
            .next_timer_fire_at()
            .await
            .unwrap_or_else(|e| store_failed(e));
        let tick = self.keiro.scheduler_state().next_tick();
        wake.into_iter().chain(fire).chain(tick).min()
    }

    /// Wakes the workers and waits until this process drives no instance, no
    /// instance is due and no timer is due or firing (seen twice in a row, so
    /// a run about to start is not missed).
    async fn settle(&self) {
        let started = Instant::now();
        let mut quiet = 0;
        while quiet < 2 {
            self.keiro.wake_resume_worker();
            self.keiro.wake_timer_workers();
            self.keiro.scheduler_state().wake();
            tokio::time::sleep(SETTLE_POLL).await;
            match self.busy().await {
                None => quiet += 1,
                Some(what) => {
                    quiet = 0;
                    if started.elapsed() > STALL_LIMIT {
                        panic!(
                            "keiro TestEnv: the runtime did not settle within {STALL_LIMIT:?} at \
                             virtual time {:?}: {what}",
                            self.now()
                        );
                    }
                }
            }
        }
    }

    /// What keeps the runtime busy, if anything.
    async fn busy(&self) -> Option<String> {
        if self.keiro.scheduler_state().is_behind() {
            return Some("the cron scheduler has not caught up with the clock".to_owned());
        }
        if !self.keiro.inflight().is_idle() {
            return Some("a workflow is still running in this process".to_owned());
        }
        let store = self.keiro.raw_store();
        let now = self.clock.now_us();
        let due = store.find_due(1).await.unwrap_or_else(|e| store_failed(e));
        if let Some(row) = due.first() {
            return Some(format!(
                "workflow `{}` (id {}) is due and no resume worker of this binary has run it \
                 (is the workflow linked into the test binary?)",
                row.name, row.id
            ));
        }
        let timers = store
            .count_due_timers(now)
            .await
            .unwrap_or_else(|e| store_failed(e));
        let firing = store
            .count_stuck_timers(i64::MAX, None)
            .await
            .unwrap_or_else(|e| store_failed(e));
        if timers + firing > 0 {
            return Some(format!(
                "{timers} timer(s) due and {firing} firing: run a timer worker on the \
                 environment (`env.keiro().timers().spawn_worker(..)`)"
            ));
        }
        None
    }
}

/// A new in-memory SQLite database of its own: SQLite's `memdb` VFS under a
/// unique name, which (unlike `sqlite::memory:`, one connection) several
/// connections share with ordinary locking, so a run's reads never wait
/// behind a write on one connection. It lives as long as the store's pool.
fn private_database_url() -> String {
    format!("sqlite:/keiro-test-env-{}?vfs=memdb", uuid::Uuid::new_v4())
}

/// A store error in a test environment: nothing a test can recover from.
fn store_failed(error: keiro_store::StoreError) -> ! {
    panic!("keiro TestEnv: the in-memory store failed: {error}")
}
