//! In-process wake-ups for workflows waiting in memory on a step someone else
//! records (an awakeable's answer, a child's end): the recorder notifies, the
//! waiter looks at the store at once instead of at its next poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::run::lock;
use crate::Keiro;

/// Waiters per workflow instance id, with how many wait.
pub(crate) type WaiterMap = Mutex<HashMap<String, (Arc<Notify>, usize)>>;

/// One workflow run waiting in memory; unregisters itself when dropped.
pub(crate) struct Waiter {
    pub(crate) notify: Arc<Notify>,
    keiro: Keiro,
    id: String,
}

impl Keiro {
    /// Registers a waiter for steps recorded for instance `id`.
    pub(crate) fn waiter(&self, id: &str) -> Waiter {
        let mut waiters = lock(&self.inner.waiters);
        let entry = waiters
            .entry(id.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiter {
            notify: entry.0.clone(),
            keiro: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Tells this process's waiters on instance `id` that a step was recorded
    /// for it.
    pub(crate) fn step_recorded(&self, id: &str) {
        if let Some((notify, _)) = lock(&self.inner.waiters).get(id) {
            notify.notify_waiters();
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiters = lock(&self.keiro.inner.waiters);
        if let Some(entry) = waiters.get_mut(&self.id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                waiters.remove(&self.id);
            }
        }
    }
}
