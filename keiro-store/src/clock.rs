//! Where the store's "now" comes from: the system clock, or a manual clock a
//! test moves by hand ([`Clock::manual`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::now_us;

/// The source of every durable "now": wake and fire times, sleep deadlines,
/// `recv` timeouts, workflow deadlines, leases and the bookkeeping columns a
/// [`Store`](crate::Store) writes. Cheap to clone; clones of a manual clock
/// share its time.
///
/// [`Clock::system`] (the default) reads [`SystemTime::now`]. A
/// [`Clock::manual`] clock stands still until [`Clock::set_us`] moves it, so
/// a test can make three days pass in an instant. Executor heartbeats (a
/// process's liveness) always use the system clock: they are about real
/// processes, not about durable time.
#[derive(Clone, Default)]
pub struct Clock {
    /// `None`: the system clock. `Some`: a manual clock's time, in µs since
    /// the Unix epoch, shared by its clones.
    manual: Option<Arc<AtomicI64>>,
    /// The last creation stamp handed out ([`Clock::creation_stamps`]),
    /// shared by its clones.
    stamped: Arc<AtomicI64>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A manual clock that reads `start` until it is moved.
    pub fn manual(start: SystemTime) -> Clock {
        Clock {
            manual: Some(Arc::new(AtomicI64::new(to_us(start)))),
            stamped: Arc::default(),
        }
    }

    /// Whether this is a manual clock.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// Now, in microseconds since the Unix epoch (the store's unit of time).
    #[inline]
    pub fn now_us(&self) -> i64 {
        match &self.manual {
            None => now_us(),
            Some(at) => at.load(Ordering::SeqCst),
        }
    }

    /// Now, as a [`SystemTime`].
    pub fn now(&self) -> SystemTime {
        match &self.manual {
            None => SystemTime::now(),
            Some(at) => UNIX_EPOCH + Duration::from_micros(at.load(Ordering::SeqCst).max(0) as u64),
        }
    }

    /// `n` consecutive creation stamps (µs since the Unix epoch), returning
    /// the first: at or after now, and after every stamp this clock or a
    /// clone of it handed out before. A queue runs equal priorities in
    /// creation order, so two enqueues of one store (every clone of a
    /// store shares its clock) never share a stamp, however close
    /// together, across a large batch's commit, or while a manual clock
    /// stands still. At most a few µs ahead of now under load; as far
    /// ahead as the calls a standing manual clock saw.
    pub fn creation_stamps(&self, n: usize) -> i64 {
        let n = i64::try_from(n.max(1)).unwrap_or(i64::MAX);
        let now = self.now_us();
        let mut first = now;
        // `fetch_update` retries the closure until its swap wins.
        let _ = self
            .stamped
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                first = now.max(last.saturating_add(1));
                Some(first.saturating_add(n - 1))
            });
        first
    }

    /// Moves a manual clock forward to `at_us` (µs since the Unix epoch); a
    /// time before its current one leaves it where it is. Returns the clock's
    /// time afterwards. The system clock cannot be moved: it is left alone and
    /// its current time returned.
    pub fn set_us(&self, at_us: i64) -> i64 {
        match &self.manual {
            None => now_us(),
            Some(at) => at.fetch_max(at_us, Ordering::SeqCst).max(at_us),
        }
    }
}

impl Clock {
    /// Sets a manual clock to exactly `at_us`, backwards too; the system clock
    /// is left alone. Only for a runtime nobody else uses, between runs (keiro's
    /// private replay runtime sets it to each history's time): a clock shared
    /// with running workflows moves forward only, through [`Clock::set_us`].
    pub fn reset_us(&self, at_us: i64) {
        if let Some(at) = &self.manual {
            at.store(at_us, Ordering::SeqCst);
            self.stamped.store(0, Ordering::SeqCst);
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.manual {
            None => f.write_str("Clock::System"),
            Some(at) => f
                .debug_tuple("Clock::Manual")
                .field(&at.load(Ordering::SeqCst))
                .finish(),
        }
    }
}

/// `t` in µs since the Unix epoch (0 before it, `i64::MAX` past year 294,247).
fn to_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_stamps_never_repeat_even_while_the_clock_stands_still() {
        let clock = Clock::manual(UNIX_EPOCH + Duration::from_secs(1_000));
        let twin = clock.clone();
        let at = clock.now_us();
        assert_eq!(clock.creation_stamps(1), at);
        assert_eq!(twin.creation_stamps(3), at + 1, "a clone shares the stamps");
        assert_eq!(clock.creation_stamps(1), at + 4, "after the batch of three");
        clock.set_us(at + 1_000);
        assert_eq!(
            clock.creation_stamps(2),
            at + 1_000,
            "the clock moved past them"
        );
        assert_eq!(clock.creation_stamps(1), at + 1_002);
        let system = Clock::system();
        let first = system.creation_stamps(1);
        assert!(system.creation_stamps(1) > first);
    }

    #[test]
    fn a_manual_clock_moves_only_forward_and_clones_share_it() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000);
        let clock = Clock::manual(start);
        let twin = clock.clone();
        assert_eq!(clock.now(), start);
        assert_eq!(twin.set_us(2_000_000_000), 2_000_000_000);
        assert_eq!(clock.now_us(), 2_000_000_000);
        assert_eq!(
            clock.set_us(5),
            2_000_000_000,
            "a manual clock never goes back"
        );
        assert!(clock.is_manual() && !Clock::system().is_manual());
    }
}
