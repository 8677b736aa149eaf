//! The context of a running workflow: which instance it is, its journal (read
//! once per invocation) and the next step sequence number.
//!
//! It travels in a tokio task-local, so `#[step]` calls and `keiro::now()` find
//! it without an explicit parameter; outside a workflow there is none and they
//! behave as plain calls.

mod sleep;
mod step;
mod values;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use keiro_store::StepRow;
use tokio::sync::oneshot;

use crate::{Error, Keiro};

pub use sleep::{sleep, sleep_until};
pub(crate) use step::{run_step, StepKind};
pub use step::{step_once, step_retry, StepMeta};
pub use values::{now, uuid};

tokio::task_local! {
    static CONTEXT: Option<Arc<WorkflowContext>>;
}

/// The workflow context of the current task, if any.
pub(crate) fn current() -> Option<Arc<WorkflowContext>> {
    CONTEXT.try_with(|c| c.clone()).ok().flatten()
}

/// Inside a workflow, the current context and a newly allocated step id: how
/// every journaled call takes its id at call time, before it is polled.
pub(crate) fn claim_seq() -> Option<(Arc<WorkflowContext>, i64)> {
    current().map(|cx| {
        let seq = cx.next_seq();
        (cx, seq)
    })
}

/// Runs `fut` with `cx` as the current workflow context (or none).
pub(crate) async fn scope<F: std::future::Future>(
    cx: Option<Arc<WorkflowContext>>,
    fut: F,
) -> F::Output {
    CONTEXT.scope(cx, fut).await
}

/// Why a run stopped before its body returned.
#[derive(Debug)]
pub(crate) enum Halt {
    /// Something went wrong (non-determinism, an undecodable record, a store
    /// failure).
    Error(Error),
    /// The workflow waits until `wake_at` (ms since the Unix epoch): its future
    /// is dropped and its row keeps the wake time.
    Suspend {
        /// When it is due again.
        wake_at: i64,
    },
}

/// One invocation of one workflow instance.
pub(crate) struct WorkflowContext {
    pub(crate) keiro: Keiro,
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) generation: i64,
    /// Waits at most this long in memory; longer ones suspend the run.
    pub(crate) suspend_after: std::time::Duration,
    journal: Mutex<HashMap<i64, StepRow>>,
    next_seq: AtomicI64,
    abort: Mutex<Option<oneshot::Sender<Halt>>>,
}

impl WorkflowContext {
    /// A context over `journal` (the rows already recorded for this generation);
    /// the receiver yields what stops the run early, if anything does.
    pub(crate) fn new(
        keiro: Keiro,
        name: String,
        id: String,
        generation: i64,
        journal: Vec<StepRow>,
    ) -> (Arc<WorkflowContext>, oneshot::Receiver<Halt>) {
        let (abort, aborted) = oneshot::channel();
        let suspend_after = keiro.inner.suspend_after;
        let cx = WorkflowContext {
            keiro,
            name,
            id,
            generation,
            suspend_after,
            journal: Mutex::new(journal.into_iter().map(|r| (r.seq, r)).collect()),
            next_seq: AtomicI64::new(0),
            abort: Mutex::new(Some(abort)),
        };
        (Arc::new(cx), aborted)
    }

    /// Allocates the next step id. Called when a step is *called*, so the
    /// order of calls, not of polls, decides ids.
    pub(crate) fn next_seq(&self) -> i64 {
        self.next_seq.fetch_add(1, Ordering::SeqCst)
    }

    /// How many step ids this run has allocated.
    pub(crate) fn allocated(&self) -> i64 {
        self.next_seq.load(Ordering::SeqCst)
    }

    /// The recorded row for `seq`, if the journal has one.
    pub(crate) fn recorded(&self, seq: i64) -> Option<StepRow> {
        lock(&self.journal).get(&seq).cloned()
    }

    /// The recorded step with the lowest seq at or beyond `from`, if any: a
    /// journal entry the code never reached.
    pub(crate) fn first_recorded_from(&self, from: i64) -> Option<StepRow> {
        lock(&self.journal)
            .values()
            .filter(|r| r.seq >= from)
            .min_by_key(|r| r.seq)
            .cloned()
    }

    /// Stops the run with `error`: the runner drops the workflow's future and
    /// reports it. Only the first halt counts.
    pub(crate) fn abort(&self, error: Error) {
        self.halt(Halt::Error(error));
    }

    /// Stops the run early: the runner drops the workflow's future and records
    /// why. Only the first halt counts.
    pub(crate) fn halt(&self, halt: Halt) {
        if let Some(sender) = lock(&self.abort).take() {
            let _ = sender.send(halt);
        }
    }

    /// Non-determinism at `seq`: the journal holds `recorded` where the code
    /// now calls `found`.
    pub(crate) fn non_deterministic(&self, seq: i64, recorded: &StepRow, found: String) -> Error {
        Error::NonDeterministic {
            name: self.name.clone(),
            id: self.id.clone(),
            seq,
            expected: describe(&recorded.kind, &recorded.name),
            found,
        }
    }
}

/// How a step shows in a diagnostic: ``step `reserve` ``, `keiro::now()`.
pub(crate) fn describe(kind: &str, name: &str) -> String {
    match kind {
        "step" => format!("step `{name}`"),
        "child" => format!("child workflow `{name}`"),
        other => format!("keiro::{other}() `{name}`"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
