//! Whether a timer worker loop's clock agrees with the database server's.
//!
//! A timer falls due by the clock of the worker that claims it, and a stale
//! claim is requeued by it too: a worker whose clock runs ahead fires timers
//! early and requeues fires still in flight elsewhere (which then fire
//! twice), one whose clock runs behind fires them late. On PostgreSQL a
//! [`super::Timers::spawn_worker`] loop reads the server's clock every
//! [`CLOCK_RECHECK`] and claims nothing while its own is off by more than
//! [`super::Timers::max_clock_skew`], or as soon as a step of its wall clock
//! puts it beyond (see
//! [`ClockVerdict::off_by`]); [`super::Timers::run_once`] and
//! [`super::Timers::drain`] refuse instead. One guard serves a
//! [`super::Timers`], its clones and their loops; every `Timers` a runtime
//! hands out ([`crate::Keiro::timers`]) shares the runtime's. SQLite has no
//! second clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use keiro_store::Store;
use tokio::time::Instant;

use crate::error::clock_offset_words;
use crate::runtime::clock_check::{Change, ClockVerdict};
use crate::runtime::lock;

/// How often a loop reads the server's clock (as often as an executor's
/// heartbeat does).
pub(crate) const CLOCK_RECHECK: Duration = Duration::from_millis(2_500);

/// How long a loop waits for one reading: a slow reading must not hold up
/// its claims for long.
const CLOCK_READING: Duration = Duration::from_secs(1);

/// The verdict on this process's clock of the timer loops and calls that
/// share it, read again every [`CLOCK_RECHECK`] by whichever asks first
/// once a reading is due (the others meanwhile go by the last verdict, or
/// wait for the first).
#[derive(Debug)]
pub(crate) struct ClockGuard {
    verdict: ClockVerdict,
    /// When the next reading is due: moved on only once a reading ended, so
    /// a reader dropped mid-way leaves it due for the next caller.
    next_reading: Mutex<Instant>,
    /// Held while a reading is taken: one at a time.
    reading: tokio::sync::Mutex<()>,
    /// Whether a reading has ended (with a verdict or not): until then a
    /// caller waits for it rather than claim on no verdict at all.
    has_read: AtomicBool,
}

impl ClockGuard {
    /// A guard allowing `limit`, reading the clock at its first check.
    pub(crate) fn new(limit: Duration) -> ClockGuard {
        ClockGuard {
            verdict: ClockVerdict::new(limit),
            next_reading: Mutex::new(Instant::now()),
            reading: tokio::sync::Mutex::new(()),
            has_read: AtomicBool::new(false),
        }
    }

    /// Whether nothing may be claimed now: see [`ClockGuard::off_by`].
    pub(crate) async fn is_off(&self, store: &Store) -> bool {
        self.off_by(store).await.is_some()
    }

    /// How far this process's clock is off the server's (µs, positive when
    /// it runs ahead) when that is beyond the limit. Reads the server's
    /// clock when a reading is due and nobody else is taking it (a failed
    /// or slow reading keeps the last verdict), logging when the verdict
    /// changes. A store on a manual clock is never off, nor is any clock
    /// under a limit of `Duration::MAX` (nothing is read then).
    pub(crate) async fn off_by(&self, store: &Store) -> Option<i64> {
        if self.limit() == Duration::MAX {
            return None;
        }
        if self.reading_due() {
            let held = match self.reading.try_lock() {
                Ok(held) => Some(held),
                // Another caller is reading: its verdict will do, unless
                // there is none yet.
                Err(_) if self.has_read.load(Ordering::SeqCst) => None,
                Err(_) => Some(self.reading.lock().await),
            };
            // Still due once held: the reading waited for may have been it.
            if held.is_some() && self.reading_due() {
                match tokio::time::timeout(CLOCK_READING, self.verdict.read(store)).await {
                    Ok(Ok(verdict)) => self.log(self.verdict.keep(&verdict)),
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "keiro timer worker could not read the database server's clock");
                    }
                    Err(_) => {}
                }
                *lock(&self.next_reading) = Instant::now() + CLOCK_RECHECK;
                self.has_read.store(true, Ordering::SeqCst);
            }
        }
        self.verdict.off_by()
    }

    /// Whether the next reading is due.
    fn reading_due(&self) -> bool {
        Instant::now() >= *lock(&self.next_reading)
    }

    /// The limit this guard allows.
    pub(crate) fn limit(&self) -> Duration {
        self.verdict.limit()
    }

    /// Says when the loop stops claiming and when it claims again.
    fn log(&self, change: Change) {
        match change {
            Change::WentOff(off) => tracing::error!(
                "keiro timer worker stops claiming timers: this process's clock is {} the \
                 database server's, more than max_clock_skew ({:?}) allows. Timers fall due by \
                 the claiming worker's clock, so they would fire early or late, and fires still \
                 running elsewhere would be requeued and fire twice; synchronise this host's \
                 clock (NTP)",
                clock_offset_words(off / 1000),
                self.verdict.limit()
            ),
            Change::CameBack => tracing::info!(
                "keiro timer worker: this process's clock is back within max_clock_skew of the \
                 database server's; it claims timers again"
            ),
            // Unchanged: said when it changed.
            Change::Unchanged => {}
        }
    }

    /// How long until the next reading is due.
    pub(crate) fn until_next_reading(&self) -> Duration {
        lock(&self.next_reading).saturating_duration_since(Instant::now())
    }
}
