//! When a live run last renewed its lease, for the watch that names a run
//! whose task is not being polled.
//!
//! A run renews its lease from its own task, beside its body. A step body
//! that blocks the thread (`std::thread::sleep`, blocking I/O, a long
//! computation outside `spawn_blocking`) stops the renewals with it: the
//! lease lapses, another worker may take the instance over and run its steps
//! again, and nothing else says why. The executor heartbeat, a task of its
//! own, looks at every live run's last renewal and warns once per run whose
//! lease may have lapsed while it was still being driven.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::runtime::lock;

/// A run's last lease renewal while it is driven.
#[derive(Debug, Default)]
pub(crate) struct LeaseWatch {
    /// When the lease was last granted or renewed; `None` before the run is
    /// driven and once its driving has ended (its end is being recorded).
    renewed: Mutex<Option<Instant>>,
    /// Whether the watch has warned of this run already.
    warned: AtomicBool,
    /// Wakes the steps waiting in [`LeaseWatch::unless_lapsed`].
    renewals: Notify,
    /// Whether the run stopped because another run moved the instance on
    /// while this one was held up, the lease renewed to this process.
    overtaken: AtomicBool,
}

impl LeaseWatch {
    /// The lease was granted or renewed at `at` (the run is being driven).
    pub(crate) fn renewed(&self, at: Instant) {
        *lock(&self.renewed) = Some(at);
        self.renewals.notify_waiters();
    }

    /// The run stops because another run moved the instance on while this
    /// one was held up; this process holds the lease it just renewed.
    pub(crate) fn set_overtaken(&self) {
        self.overtaken.store(true, Ordering::SeqCst);
    }

    /// Whether [`LeaseWatch::set_overtaken`] was called.
    pub(crate) fn overtaken(&self) -> bool {
        self.overtaken.load(Ordering::SeqCst)
    }

    /// Returns at once unless the lease went unrenewed for `ttl` while the
    /// run is driven (its task was held up: the lease may be another's);
    /// then waits until the run's drive loop, which checks such a lease
    /// before polling the body on, has renewed it. A body that goes on
    /// without awaiting (a pipelined step's row is journaled later) starts
    /// no step body on a lease that may have lapsed. If the lease is lost,
    /// the run ends and this is dropped with the body.
    pub(crate) async fn unless_lapsed(&self, ttl: Duration) {
        loop {
            let renewal = self.renewals.notified();
            let lapsed = lock(&self.renewed).is_some_and(|at| at + ttl <= Instant::now());
            if !lapsed {
                return;
            }
            renewal.await;
        }
    }

    /// When the lease was last renewed; the run is no longer driven.
    pub(crate) fn finish(&self) -> Option<Instant> {
        lock(&self.renewed).take()
    }

    /// How long the lease has gone unrenewed when that is past `ttl` (its
    /// lease may have lapsed while the run is still driven), the first time
    /// only.
    pub(crate) fn starved_once(&self, ttl: Duration, now: Instant) -> Option<Duration> {
        let renewed = (*lock(&self.renewed))?;
        let silent = now.saturating_duration_since(renewed);
        (silent > ttl && !self.warned.swap(true, Ordering::SeqCst)).then_some(silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_named_once_when_its_lease_went_unrenewed_past_the_ttl() {
        let watch = LeaseWatch::default();
        let ttl = Duration::from_secs(10);
        let start = Instant::now();
        assert_eq!(
            watch.starved_once(ttl, start + ttl * 2),
            None,
            "not driven yet"
        );
        watch.renewed(start);
        assert_eq!(
            watch.starved_once(ttl, start + ttl),
            None,
            "within its lease"
        );
        let late = start + ttl + Duration::from_secs(2);
        assert_eq!(
            watch.starved_once(ttl, late),
            Some(ttl + Duration::from_secs(2))
        );
        assert_eq!(watch.starved_once(ttl, late), None, "once per run");
        assert_eq!(watch.finish(), Some(start));
        assert_eq!(watch.starved_once(ttl, late), None, "no longer driven");
    }
}
