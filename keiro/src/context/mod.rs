//! The context of a running workflow: which instance it is, its journal (read
//! once per invocation) and the next step sequence number.
//!
//! It travels in a tokio task-local, so `#[step]` calls and `keiro::now()` find
//! it without an explicit parameter; outside a workflow there is none and they
//! behave as plain calls.

mod awakeable;
mod awakeable_id;
mod awakeable_record;
pub(crate) mod deferred;
mod events;
pub(crate) mod lease_watch;
mod messages;
mod patch;
pub(crate) mod pipeline;
mod select;
mod sleep;
mod step;
mod timeout;
mod transaction;
mod values;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use keiro_store::{StepRow, WaitingStep};
use tokio::sync::oneshot;

use crate::runtime::lock;
use crate::{Error, Keiro};

pub use awakeable::{
    awakeable, reject_awakeable, resolve_awakeable, resolve_awakeable_tx, Awakeable,
    AwakeableTimeout,
};
pub use events::{
    close_stream, get_event, read_stream, set_event, write_stream, GetEvent, StreamReader,
};
pub use messages::{recv, send, send_tx, Recv, RecvTimeout, Sending};
pub use patch::{deprecate_patch, patched, MAX_PATCH_ID_BYTES};
pub use select::{branch, BranchFuture, Durable, DurableFuture, Select};
pub(crate) use select::{with_deadline, Wake};
pub use sleep::{sleep, sleep_until};
pub(crate) use step::{record, run_step, StepKind};

pub use step::{step_once, step_retry, StepMeta};
pub use timeout::StepTimeout;
pub use transaction::step_transaction;
pub use values::{now, uuid};

tokio::task_local! {
    static CONTEXT: Option<Arc<WorkflowContext>>;
}

/// The workflow context of the current task, if any.
pub(crate) fn current() -> Option<Arc<WorkflowContext>> {
    CONTEXT.try_with(|c| c.clone()).ok().flatten()
}

/// Now by the clock of the current workflow's runtime (a
/// [`crate::testing::TestEnv`]'s is virtual); outside a workflow, the system
/// clock's.
pub(crate) fn clock_now() -> std::time::SystemTime {
    match current() {
        Some(cx) => cx.keiro.clock().now(),
        None => std::time::SystemTime::now(),
    }
}

/// Inside a workflow, the current context and a newly allocated step id: how
/// every journaled call takes its id at call time, before it is polled.
pub(crate) fn claim_seq() -> Option<(Arc<WorkflowContext>, i64)> {
    current().map(|cx| {
        let seq = cx.next_seq();
        (cx, seq)
    })
}

/// Like [`claim_seq`] for `n` consecutive ids; returns the first.
pub(crate) fn claim_seqs(n: i64) -> Option<(Arc<WorkflowContext>, i64)> {
    current().map(|cx| {
        let seq = cx.next_seq.fetch_add(n, Ordering::SeqCst);
        (cx, seq)
    })
}

/// How often a workflow waiting in memory for a step someone else records
/// (an awakeable's answer, a child's end) looks at the store.
const STEP_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits for step `seq`, which someone else records (kind `kind`, name
/// `name`): from the journal read at the start of the run, else from the store,
/// waiting in memory up to the runtime's `suspend_after` (woken at once by
/// recordings in this process) and then suspending the workflow until it is
/// recorded.
pub(crate) async fn wait_for_step(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    kind: &str,
    name: &str,
) -> StepRow {
    if let Some(row) = cx.recorded(seq) {
        return checked(cx, seq, kind, name, row).await;
    }
    let waiter = cx.keiro.waiter(&cx.id);
    let mut deadline = tokio::time::Instant::now() + cx.suspend_after;
    loop {
        let notified = waiter.notified();
        match cx
            .keiro
            .raw_store()
            .get_step(&cx.id, cx.generation, seq)
            .await
        {
            Ok(Some(row)) => return checked(cx, seq, kind, name, row).await,
            Ok(None) => {}
            Err(e) => return halt(cx, Halt::Error(Error::Store(e))).await,
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            let halt_with = Halt::Suspend {
                wake_at: None,
                awaiting: Some(seq),
                topic: None,
                waiting: Some(waiting_step(seq, kind, name)),
            };
            match select::intercept(halt_with) {
                Some(halt_with) => return halt(cx, halt_with).await,
                // A select's branch: its wish is filed; it keeps waiting here
                // until the select suspends the run or another branch wins.
                None => deadline = now + cx.suspend_after,
            }
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(STEP_POLL.min(deadline - now)) => {}
        }
    }
}

/// What a run waiting for step `seq` (kind `kind`: a child's end or an
/// awakeable's resolution) waits on, as listings show it.
fn waiting_step(seq: i64, kind: &str, name: &str) -> WaitingStep {
    let child = kind == StepKind::Child.as_str();
    WaitingStep {
        seq,
        kind: if child { "child" } else { "awakeable" }.to_owned(),
        name: name.to_owned(),
    }
}

async fn checked(cx: &WorkflowContext, seq: i64, kind: &str, name: &str, row: StepRow) -> StepRow {
    if row.kind != kind || row.name != name {
        let error = cx.non_deterministic(seq, &row, describe(kind, name));
        return halt(cx, Halt::Error(error)).await;
    }
    row
}

/// Stops the run and never returns; the runner drops this future.
pub(crate) async fn halt<T>(cx: &WorkflowContext, why: Halt) -> T {
    cx.halt(why);
    std::future::pending().await
}

/// Stops a replay without side effects ([`WorkflowContext::replaying`]) where
/// the code goes beyond the journal, before anything runs: the run ends as
/// suspended with nothing to wake it. Never returns.
pub(crate) async fn beyond_history<T>(cx: &WorkflowContext) -> T {
    let stop = Halt::Suspend {
        wake_at: None,
        awaiting: None,
        topic: None,
        waiting: None,
    };
    halt(cx, stop).await
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
    /// The workflow waits: its future is dropped and its row keeps the wake
    /// time.
    Suspend {
        /// When it is due again by time (ms since the Unix epoch), if ever.
        wake_at: Option<i64>,
        /// The step whose recording (an awakeable's resolution, a child's end)
        /// makes it due.
        awaiting: Option<i64>,
        /// The message topic it waits on: a message there makes it due.
        topic: Option<String>,
        /// What it waits on, as operators see it.
        waiting: Option<WaitingStep>,
    },
    /// The workflow waits on several things at once (a `keiro::select!`):
    /// due at the first of them.
    SuspendAny(Wake),
    /// The instance was cancelled; stop without recording anything more.
    Cancelled,
    /// End this generation and start the next with this input.
    ContinueAsNew {
        /// The next generation's encoded arguments.
        input: String,
    },
    /// Another executor journaled a step of this run first (a pipelined
    /// run learns it after the fact): stop without recording anything.
    LeaseLost,
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
    /// A replay without side effects (`keiro::testing::replay`): the run
    /// stops where it would run a step body or start a child.
    pub(crate) replay_only: bool,
    /// The rows not yet durable of a run with a pipelined journal; `None`:
    /// it journals strictly.
    pipeline: Option<pipeline::Pipeline>,
    /// The instance's create, when the run started before recording it.
    pub(crate) deferred: deferred::Deferred,
    /// Transactional steps of this run between their `BEGIN` and their
    /// commit or rollback.
    transactions: std::sync::atomic::AtomicUsize,
    /// Told when the last open transactional step of the run closes.
    transactions_closed: tokio::sync::Notify,
    /// When the run last renewed its lease, while it is driven.
    pub(crate) lease: lease_watch::LeaseWatch,
    /// The instance's deadline (µs since the Unix epoch; `i64::MAX` for
    /// none), once its driver set it.
    deadline_us: AtomicI64,
    /// Told by a step that found the deadline passed (by the wall clock)
    /// and stopped there: the driver ends the run now, without waiting
    /// for its own timer (which a suspended machine or a stepped clock
    /// may hold back).
    deadline_reached: tokio::sync::Notify,
}

/// A transactional step of a run holding its transaction open (see
/// [`WorkflowContext::in_transaction`]); counted out when dropped.
pub(crate) struct InTransaction<'a>(&'a WorkflowContext);

impl Drop for InTransaction<'_> {
    fn drop(&mut self) {
        let open = self
            .0
            .transactions
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if open == 1 {
            // A permit when nobody waits: a wait begun later returns at once
            // and looks again.
            self.0.transactions_closed.notify_one();
        }
    }
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
        let pipelined = keiro.journal_of(&name) == crate::Journal::Pipelined;
        WorkflowContext::with_mode(keiro, name, id, generation, journal, false, pipelined)
    }

    /// A context for a replay without side effects over `journal`: where the
    /// code goes beyond it (a step body to run, a child to start) the run
    /// stops as if suspended, with nothing to wake it.
    pub(crate) fn replaying(
        keiro: Keiro,
        name: String,
        id: String,
        generation: i64,
        journal: Vec<StepRow>,
    ) -> (Arc<WorkflowContext>, oneshot::Receiver<Halt>) {
        WorkflowContext::with_mode(keiro, name, id, generation, journal, true, false)
    }

    fn with_mode(
        keiro: Keiro,
        name: String,
        id: String,
        generation: i64,
        journal: Vec<StepRow>,
        replay_only: bool,
        pipelined: bool,
    ) -> (Arc<WorkflowContext>, oneshot::Receiver<Halt>) {
        let (abort, aborted) = oneshot::channel();
        let suspend_after = keiro.suspend_after();
        let cx = WorkflowContext {
            keiro,
            name,
            id,
            generation,
            suspend_after,
            journal: Mutex::new(journal.into_iter().map(|r| (r.seq, r)).collect()),
            next_seq: AtomicI64::new(0),
            abort: Mutex::new(Some(abort)),
            replay_only,
            pipeline: pipelined.then(pipeline::Pipeline::default),
            deferred: deferred::Deferred::default(),
            transactions: std::sync::atomic::AtomicUsize::new(0),
            transactions_closed: tokio::sync::Notify::new(),
            lease: lease_watch::LeaseWatch::default(),
            deadline_us: AtomicI64::new(i64::MAX),
            deadline_reached: tokio::sync::Notify::new(),
        };
        (Arc::new(cx), aborted)
    }

    /// Records the instance's deadline, which its driver stops the run at.
    pub(crate) fn set_deadline(&self, deadline_us: Option<i64>) {
        self.deadline_us.store(
            deadline_us.unwrap_or(i64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether the instance's deadline has passed by its runtime's clock:
    /// its driver is ending the run as timed out.
    pub(crate) fn deadline_passed(&self) -> bool {
        self.deadline_us.load(std::sync::atomic::Ordering::Relaxed) <= self.keiro.now_us()
    }

    /// Stops the calling step for good past the deadline: tells the driver
    /// to end the run as timed out now, and waits for it to.
    pub(crate) async fn stop_at_deadline<R>(&self) -> R {
        self.deadline_reached.notify_one();
        std::future::pending().await
    }

    /// Returns once a step stopped at the deadline (see
    /// [`WorkflowContext::stop_at_deadline`]).
    pub(crate) async fn deadline_reached(&self) {
        self.deadline_reached.notified().await
    }

    /// Counts a transactional step of this run in until the guard drops.
    pub(crate) fn enter_transaction(&self) -> InTransaction<'_> {
        self.transactions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InTransaction(self)
    }

    /// Whether a transactional step of this run holds its transaction open.
    /// Its lease cannot go elsewhere meanwhile unnoticed: the step's journal
    /// row commits in that transaction, first-wins, so a renewal it holds up
    /// (on SQLite the body has the only write lock) may wait for it.
    pub(crate) fn in_transaction(&self) -> bool {
        self.transactions.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Returns once no transactional step of the run is open (perhaps
    /// early: callers look again).
    pub(crate) async fn transactions_closed(&self) {
        if self.in_transaction() {
            self.transactions_closed.notified().await;
        }
    }

    /// Whether a row of `kind` queues behind the run's next steps instead of
    /// being durable before its call returns: in a pipelined run, the pure
    /// results (steps, `keiro::now()`, `keiro::uuid()`); everything else
    /// waits for them and journals strictly.
    pub(crate) fn pipelines(&self, kind: StepKind) -> bool {
        self.pipeline.is_some() && matches!(kind, StepKind::Step | StepKind::Now | StepKind::Uuid)
    }

    /// Allocates the next step id. Called when a step is *called*, so the
    /// order of calls, not of polls, decides ids.
    pub(crate) fn next_seq(&self) -> i64 {
        self.next_seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Allocates the next step id only if `wanted` says so for it (read and
    /// claimed at once): `Ok(id)` when claimed, else `Err(the next id)`.
    pub(crate) fn claim_seq_if(&self, mut wanted: impl FnMut(i64) -> bool) -> Result<i64, i64> {
        self.next_seq
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |seq| {
                wanted(seq).then_some(seq + 1)
            })
    }

    /// Allocates two consecutive step ids; returns the first.
    pub(crate) fn next_seq_pair(&self) -> i64 {
        self.next_seq.fetch_add(2, Ordering::SeqCst)
    }

    /// How many step ids this run has allocated.
    pub(crate) fn allocated(&self) -> i64 {
        self.next_seq.load(Ordering::SeqCst)
    }

    /// The first seq this run has neither allocated nor loaded: a row at
    /// or beyond it was journaled by another run.
    pub(crate) fn known_frontier(&self) -> i64 {
        let loaded = lock(&self.journal).keys().max().map_or(0, |seq| seq + 1);
        self.allocated().max(loaded)
    }

    /// Takes `rows` of this run's instance and generation, read from the
    /// store, into the journal it replays from, keeping the rows it has.
    pub(crate) fn adopt(&self, rows: Vec<StepRow>) {
        let mut journal = lock(&self.journal);
        for row in rows {
            journal.entry(row.seq).or_insert(row);
        }
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
        // Inside a select's branch a suspension is only that branch's wish.
        let Some(halt) = select::intercept(halt) else {
            return;
        };
        if let Some(sender) = lock(&self.abort).take() {
            let _ = sender.send(halt);
        }
    }

    /// After the body returned: non-determinism when the journal records an
    /// entry the code never reached (at or beyond the ids it allocated).
    pub(crate) fn unreached(&self) -> Option<Error> {
        self.first_recorded_from(self.allocated()).map(|unreached| {
            self.non_deterministic(
                unreached.seq,
                &unreached,
                "the workflow returning before it".to_owned(),
            )
        })
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
        "patch" => format!("keiro::patched(\"{name}\")"),
        other => format!("keiro::{other}() `{name}`"),
    }
}
