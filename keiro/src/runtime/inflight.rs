//! Wake-ups for whoever waits in this process: workflows waiting in memory on
//! a step someone else records (an awakeable's answer, a child's end), callers
//! awaiting an instance's end, and the resume worker. Recorders in this
//! process notify directly; on PostgreSQL, recorders anywhere `NOTIFY
//! keiro_wake` with the instance id and one listener connection per process
//! forwards it. A lost notification costs latency (the waiters still poll),
//! never work.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::workflow::drive::lock;
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
    /// Registers a waiter for steps recorded for (or the end of) instance `id`.
    pub(crate) fn waiter(&self, id: &str) -> Waiter {
        self.ensure_listener();
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

impl Keiro {
    /// On PostgreSQL, starts (once) the task that forwards `keiro_wake`
    /// notifications to this process's waiters and resume worker.
    pub(crate) fn ensure_listener(&self) {
        let keiro_store::Store::Postgres(pg) = &self.inner.store else {
            return;
        };
        if self.inner.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        let pg = pg.clone();
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                match pg.listen_wakes().await {
                    Ok(mut listener) => loop {
                        match listener.recv().await {
                            Ok(notification) => {
                                let Some(inner) = inner.upgrade() else { return };
                                let keiro = Keiro { inner };
                                let id = notification.payload();
                                if !id.is_empty() {
                                    keiro.step_recorded(id);
                                }
                                keiro.inner.wake.notify_one();
                            }
                            Err(error) => {
                                tracing::warn!(%error, "keiro wake listener lost its connection");
                                break;
                            }
                        }
                    },
                    Err(error) => tracing::warn!(%error, "keiro wake listener cannot connect"),
                }
                if inner.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
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
