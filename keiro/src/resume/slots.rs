//! A resume worker's concurrency budget, shared by its passes.
//!
//! A pass takes slots for what it claims and gives each back when the run
//! holding it ends for good (a queued instance's slot passes to the
//! successor it hands over to, or to the instances a refill claims). Passes
//! overlap: a long run holds its slot, not the worker, so the next pass
//! claims into the slots the other runs left free.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The free slots of one worker (or of one [`crate::Keiro::resume_once`]).
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    free: Arc<Semaphore>,
    /// Set while the worker waits for free slots (more is due than it had
    /// room for): a pass that has refilled as many as a pass claims then
    /// refills no more, so its slots come back and the next pass claims
    /// from the default queue and every queue alike.
    wanted: Arc<AtomicBool>,
    /// Told whenever slots go back, for [`Slots::until_free`].
    freed: Arc<Notify>,
}

impl Slots {
    /// A budget of `n` slots, all free.
    pub(super) fn new(n: usize) -> Slots {
        Slots {
            free: Arc::new(Semaphore::new(n)),
            wanted: Arc::new(AtomicBool::new(false)),
            freed: Arc::new(Notify::new()),
        }
    }

    /// Takes up to `at_most` free slots, as many as are free (none when
    /// none is).
    pub(crate) fn take(&self, at_most: usize) -> Held {
        loop {
            let n = self.free.available_permits().min(at_most);
            let count = u32::try_from(n).unwrap_or(0);
            // Another taker may have raced in between: look again.
            if let Ok(permit) = self.free.clone().try_acquire_many_owned(count) {
                return Held {
                    permit: Some(permit),
                    wanted: self.wanted.clone(),
                    freed: self.freed.clone(),
                };
            }
        }
    }

    /// Waits until at least `n` slots are free (taking none), asking the
    /// passes for their slots meanwhile (see [`Held::wanted`]). Slots stay
    /// free for [`Slots::take`] while it waits: the wait holds none of them
    /// (a semaphore's queued `acquire_many` would keep each one freed until
    /// it had all, and a cron tick could take none meanwhile).
    pub(super) async fn until_free(&self, n: usize) {
        let n = n.max(1);
        self.wanted.store(true, Ordering::SeqCst);
        // Cleared however the wait ends (it may be dropped for a stop).
        let _wanted = Unwant(&self.wanted);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the look: a slot going back in between
            // wakes it.
            freed.as_mut().enable();
            if self.free.available_permits() >= n {
                return;
            }
            freed.await;
        }
    }
}

/// Clears the worker's want of slots when dropped.
struct Unwant<'a>(&'a AtomicBool);

impl Drop for Unwant<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Slots a pass holds (see [`Slots::take`]). Dropped, it gives back what it
/// still holds, so a pass's task that panicked or was aborted keeps none.
#[derive(Debug)]
pub(crate) struct Held {
    /// `None` once dropped.
    permit: Option<OwnedSemaphorePermit>,
    wanted: Arc<AtomicBool>,
    freed: Arc<Notify>,
}

impl Held {
    /// How many it holds.
    pub(crate) fn count(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Gives `n` of them back (at most as many as it holds).
    pub(super) fn give_back(&mut self, n: usize) {
        let n = n.min(self.count());
        if let (Some(permit), true) = (&mut self.permit, n > 0) {
            drop(permit.split(n));
            self.freed.notify_waiters();
        }
    }

    /// Whether the worker waits for slots: a pass then does not renew its
    /// refills.
    pub(super) fn wanted(&self) -> bool {
        self.wanted.load(Ordering::SeqCst)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The slots go back first, then the waiters look.
        if self
            .permit
            .take()
            .is_some_and(|permit| permit.num_permits() > 0)
        {
            self.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn takes_only_what_is_free_and_gets_it_back() {
        let slots = Slots::new(4);
        let mut three = slots.take(3);
        let one = slots.take(3);
        let none = slots.take(3);
        assert_eq!((three.count(), one.count(), none.count()), (3, 1, 0));
        three.give_back(2);
        assert_eq!(three.count(), 1);
        assert_eq!(slots.take(8).count(), 2);
    }

    #[test]
    fn what_a_pass_holds_goes_back_when_it_is_dropped() {
        let slots = Slots::new(3);
        let mut held = slots.take(3);
        held.give_back(1);
        let freed = slots.take(8);
        assert_eq!((held.count(), freed.count()), (2, 1));
        // As when a pass's task panics.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = held;
            panic!("a pass's task panicked");
        }));
        assert!(unwound.is_err());
        assert_eq!(slots.take(8).count(), 2);
    }

    #[tokio::test]
    async fn waits_until_enough_are_free() {
        let slots = Slots::new(2);
        let mut held = slots.take(2);
        assert_eq!(held.count(), 2);
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.until_free(2).await }
        });
        held.give_back(1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "woke with one of two free");
        drop(held);
        waiting.await.unwrap();
        // Waiting took nothing.
        assert_eq!(slots.take(5).count(), 2);
    }

    #[tokio::test]
    async fn a_free_slot_can_be_taken_while_the_worker_waits_for_more() {
        let slots = Slots::new(3);
        let held = slots.take(2);
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.until_free(3).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        // As a cron tick takes one while the worker waits.
        let tick = slots.take(1);
        assert_eq!(tick.count(), 1, "the free slot is not held by the wait");
        drop(held);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "two of three free");
        drop(tick);
        waiting.await.unwrap();
    }
}
