//! What this process has in flight, per workflow instance id, behind one
//! lock: which instances it drives (so a second caller attaches to the run
//! instead of starting another), the contexts of their live runs (so a
//! cancellation stops them at once), and who waits in memory for a step
//! someone else records or for an instance's end (so a recording wakes them).
//!
//! Recorders in this process notify directly; on PostgreSQL the process's
//! listener forwards recordings made anywhere (see `listener.rs`). A lost
//! notification costs latency (waiters still poll), never work.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use keiro_store::InstanceRow;
use tokio::sync::futures::Notified;
use tokio::sync::{watch, Notify};

use super::lock;
use crate::context::WorkflowContext;
use crate::Result;

/// The outcome of one in-process run, shared with every caller waiting on it.
pub(crate) type RunResult = Option<Result<InstanceRow>>;

/// This process's instances in flight. One per runtime.
#[derive(Default)]
pub(crate) struct InFlight {
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Instances this process drives now: the workflow name and the end of
    /// the run, once it ends.
    driving: HashMap<String, (&'static str, watch::Receiver<RunResult>)>,
    /// Live runs, so a cancellation stops them at once.
    contexts: HashMap<String, Weak<WorkflowContext>>,
    /// Waiters per instance, with how many wait.
    waiters: HashMap<String, (Arc<Notify>, usize)>,
}

/// What [`InFlight::take`] found.
pub(crate) enum Slot {
    /// Nobody here drove the instance: the caller now does, and ends with
    /// [`InFlight::publish`] or [`InFlight::release`].
    Mine(Driving),
    /// A run in flight here; wait on it.
    Attached(watch::Receiver<RunResult>),
    /// The id is in flight here for another workflow name.
    Conflict(&'static str),
}

/// The right to drive one instance in this process, taken by
/// [`InFlight::take`].
pub(crate) struct Driving {
    id: String,
    sender: watch::Sender<RunResult>,
}

impl Driving {
    /// Where the end of this run will be published.
    pub(crate) fn receiver(&self) -> watch::Receiver<RunResult> {
        self.sender.subscribe()
    }
}

impl InFlight {
    /// Takes the right to drive `id` (a workflow named `name`), so one process
    /// never runs an instance twice at once.
    pub(crate) fn take(&self, id: &str, name: &'static str) -> Slot {
        let mut state = lock(&self.state);
        if let Some((existing, receiver)) = state.driving.get(id) {
            if *existing != name {
                return Slot::Conflict(existing);
            }
            return Slot::Attached(receiver.clone());
        }
        let (sender, receiver) = watch::channel(None);
        state.driving.insert(id.to_owned(), (name, receiver));
        Slot::Mine(Driving {
            id: id.to_owned(),
            sender,
        })
    }

    /// The end of the run of `id` this process drives now, if it does.
    pub(crate) fn attach(&self, id: &str) -> Option<watch::Receiver<RunResult>> {
        lock(&self.state)
            .driving
            .get(id)
            .map(|(_, receiver)| receiver.clone())
    }

    /// Gives up driving an instance and hands the end of its run to every
    /// caller attached to it and every waiter on it.
    pub(crate) fn publish(&self, driving: Driving, result: Result<InstanceRow>) {
        lock(&self.state).driving.remove(&driving.id);
        let _ = driving.sender.send(Some(result));
        self.notify(&driving.id);
    }

    /// Gives up driving an instance whose run ended unfinished: attached
    /// callers see the channel close and follow the instance through the store.
    pub(crate) fn release(&self, driving: Driving) {
        lock(&self.state).driving.remove(&driving.id);
    }

    /// Whether this process drives no instance.
    pub(crate) fn is_idle(&self) -> bool {
        lock(&self.state).driving.is_empty()
    }

    /// Registers the live run `cx` until the returned guard drops.
    pub(crate) fn enter<'a>(&'a self, cx: &Arc<WorkflowContext>) -> Live<'a> {
        lock(&self.state)
            .contexts
            .insert(cx.id.clone(), Arc::downgrade(cx));
        Live {
            inflight: self,
            id: cx.id.clone(),
        }
    }

    /// Every live run in this process.
    pub(crate) fn live_runs(&self) -> Vec<Arc<WorkflowContext>> {
        lock(&self.state)
            .contexts
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The live run of instance `id` in this process, if any.
    pub(crate) fn live(&self, id: &str) -> Option<Arc<WorkflowContext>> {
        lock(&self.state).contexts.get(id).and_then(Weak::upgrade)
    }

    /// Registers a waiter for steps recorded for (or the end of) instance `id`.
    pub(crate) fn wait(self: &Arc<Self>, id: &str) -> Waiter {
        let mut state = lock(&self.state);
        let entry = state
            .waiters
            .entry(id.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiter {
            notify: entry.0.clone(),
            inflight: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Tells this process's waiters on instance `id` that a step was recorded
    /// for it (or that it ended).
    pub(crate) fn notify(&self, id: &str) {
        if let Some((notify, _)) = lock(&self.state).waiters.get(id) {
            notify.notify_waiters();
        }
    }

    /// Tells every waiter in this process to look at the store again.
    #[cfg(feature = "postgres")]
    pub(crate) fn notify_all(&self) {
        for (notify, _) in lock(&self.state).waiters.values() {
            notify.notify_waiters();
        }
    }

    /// Tells this process's waiters that a step was recorded for the instance
    /// a wake notification names: by its id, or, for a long id, by its
    /// [`keiro_store::wake_payload`] digest (every waiter whose id maps to it).
    #[cfg(feature = "postgres")]
    pub(crate) fn notify_payload(&self, payload: &str) {
        // A short id is sent as itself: one lookup. Only a payload shaped like
        // a digest is also matched against the (rare) waiters whose ids are
        // too long to send, so an ordinary wake never scans every waiter.
        self.notify(payload);
        let is_digest = payload.len() == 17
            && payload.starts_with('#')
            && payload[1..].bytes().all(|b| b.is_ascii_hexdigit());
        if !is_digest {
            return;
        }
        let state = lock(&self.state);
        for (id, (notify, _)) in &state.waiters {
            if id.len() > keiro_store::WAKE_ID_MAX && keiro_store::wake_payload(id) == payload {
                notify.notify_waiters();
            }
        }
    }
}

/// A live run, registered until dropped.
pub(crate) struct Live<'a> {
    inflight: &'a InFlight,
    id: String,
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        lock(&self.inflight.state).contexts.remove(&self.id);
    }
}

/// One caller waiting in memory on an instance; unregisters itself when
/// dropped.
pub(crate) struct Waiter {
    notify: Arc<Notify>,
    inflight: Arc<InFlight>,
    id: String,
}

impl Waiter {
    /// Completes at the next notification for the instance. Create it before
    /// looking at the store, so a recording in between is not missed.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut state = lock(&self.inflight.state);
        if let Some(entry) = state.waiters.get_mut(&self.id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                state.waiters.remove(&self.id);
            }
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::InFlight;

    #[tokio::test]
    async fn a_long_id_waiter_is_woken_by_its_digest_payload() {
        let inflight = Arc::new(InFlight::default());
        let long = "w".repeat(10_000);
        let payload = keiro_store::wake_payload(&long).into_owned();
        assert_eq!(payload.len(), 17, "{payload}");
        let waiter = inflight.wait(&long);
        let short = inflight.wait("short");

        let notified = waiter.notified();
        let other = short.notified();
        inflight.notify_payload(&payload);
        tokio::time::timeout(Duration::from_secs(1), notified)
            .await
            .expect("the long id's waiter is woken by its digest");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other)
                .await
                .is_err(),
            "another instance's waiter sleeps on"
        );

        let notified = short.notified();
        inflight.notify_payload("short");
        tokio::time::timeout(Duration::from_secs(1), notified)
            .await
            .expect("a short id travels as it is");
    }
}
