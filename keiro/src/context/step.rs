//! Running a step inside a workflow: replay it from the journal or execute it
//! and record its result (one write, through the group-commit writer).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_store::{AppendOutcome, StepRow, StepTiming};
use serde::{de::DeserializeOwned, Serialize};
use tracing::Instrument;

use super::select::Won;
use super::{claim_seq, describe, scope, WorkflowContext};
use crate::Error;

/// A `#[step]`'s options, as written in its attribute.
#[derive(Debug, Clone, Copy)]
pub struct StepMeta {
    /// The journaled name (`#[step(name = ..)]`, default the fn name).
    pub name: &'static str,
    /// How many times the body runs before an `Err` is final (at least 1).
    pub max_attempts: u32,
    /// The delay before the second attempt; it doubles after each later one.
    pub backoff_ms: u64,
    /// `timeout_ms`: how long one attempt may run, if limited.
    pub timeout_ms: Option<u64>,
}

impl StepMeta {
    /// Waits out the backoff after failed attempt `attempt` (1-based): the
    /// step's `backoff_ms`, doubled after each later attempt, at most an hour.
    pub(crate) async fn wait_before_retry(&self, attempt: u32) {
        let delay = self
            .backoff_ms
            .saturating_mul(1u64 << (attempt - 1).min(20))
            .min(3_600_000);
        tracing::debug!(
            step = self.name,
            attempt,
            delay_ms = delay,
            "keiro step failed; retrying"
        );
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
}

/// What produced a journal row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepKind {
    /// A `#[step]` fn.
    Step,
    /// `keiro::now()`.
    Now,
    /// `keiro::uuid()`.
    Uuid,
    /// A child workflow awaited by its parent.
    Child,
    /// `keiro::sleep` / `keiro::sleep_until`: the recorded deadline.
    Sleep,
    /// `keiro::awakeable()`: its creation (the awaited type's name).
    Awakeable,
    /// `keiro::recv()`: the message taken, or its deadline passing.
    Recv,
    /// `keiro::send()` from a workflow.
    Send,
    /// `keiro::set_event()`.
    Event,
    /// `keiro::write_stream()` / `keiro::close_stream()`.
    Stream,
    /// `keiro::get_event()` read from a workflow: the value it saw.
    GetEvent,
    /// An item of `keiro::read_stream()` read from a workflow: a value, or
    /// the stream's end.
    ReadStream,
    /// `keiro::select!`: the index of the winning branch.
    Select,
    /// `keiro::patched()`: the marker of a patch the instance runs.
    Patch,
}

impl StepKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StepKind::Step => "step",
            StepKind::Now => "now",
            StepKind::Uuid => "uuid",
            StepKind::Child => "child",
            StepKind::Sleep => "sleep",
            StepKind::Awakeable => "awakeable",
            StepKind::Recv => "recv",
            StepKind::Send => "send",
            StepKind::Event => "set_event",
            StepKind::Stream => "write_stream",
            StepKind::GetEvent => "get_event",
            StepKind::ReadStream => "read_stream",
            StepKind::Select => "select",
            StepKind::Patch => "patch",
        }
    }
}

/// Runs a step whose body runs at most once per execution. Inside a workflow
/// the step id is allocated now, at the call; outside it is a plain call.
pub fn step_once<R, Fut>(
    meta: StepMeta,
    body: impl FnOnce() -> Fut + Send + 'static,
) -> impl Future<Output = R> + Send
where
    R: Serialize + DeserializeOwned + Send + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let slot = claim_seq();
    async move {
        match slot {
            None => body().await,
            Some((cx, seq)) => {
                let once = async move { (body().await, Some(1)) };
                run_timed(cx, seq, StepKind::Step, meta.name, once).await
            }
        }
    }
}

/// Runs a step that is retried on `Err` up to `meta.max_attempts` times with
/// exponential backoff from `meta.backoff_ms`; the final result, `Ok` or `Err`,
/// is journaled. Outside a workflow the retries still apply, without a journal.
pub fn step_retry<R, Fut>(
    meta: StepMeta,
    is_err: impl Fn(&R) -> bool + Send + 'static,
    mut body: impl FnMut() -> Fut + Send + 'static,
) -> impl Future<Output = R> + Send
where
    R: Serialize + DeserializeOwned + Send + 'static,
    Fut: Future<Output = R> + Send + 'static,
{
    let slot = claim_seq();
    let gate = slot.clone();
    let attempts = async move {
        let max = meta.max_attempts.max(1);
        let mut attempt = 1;
        loop {
            let out = body().await;
            if !is_err(&out) || attempt >= max {
                return (out, attempt);
            }
            meta.wait_before_retry(attempt).await;
            // An attempt that held the run up past its lease (a backoff of
            // zero may not yield to the drive loop) lets the next one start
            // only once the lease is checked; if another run journaled the
            // step meanwhile, `run_timed` replays its row.
            if let Some((cx, seq)) = &gate {
                if checked_lease(cx, *seq).await.is_some() {
                    return (out, attempt);
                }
            }
            attempt += 1;
        }
    };
    async move {
        match slot {
            None => attempts.await.0,
            Some((cx, seq)) => {
                let counted = async move {
                    let (out, attempts) = attempts.await;
                    (out, Some(attempts))
                };
                run_timed(cx, seq, StepKind::Step, meta.name, counted).await
            }
        }
    }
}

/// [`replay`] of a step found journaled, in its own `replayed` span.
async fn replay_recorded<R: DeserializeOwned>(
    cx: &WorkflowContext,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    recorded: &StepRow,
) -> R {
    let span = tracing::debug_span!("keiro.step", name, seq, replayed = true);
    replay_taken_in(cx, seq, kind, name, recorded)
        .instrument(span)
        .await
}

/// Replays the row another run journaled for step `seq` while this run was
/// held up, which the check of its lease took in, marking the step's span
/// (its body may have run) as replayed; [`replay_recorded`] runs it in a
/// span of its own.
pub(crate) async fn replay_taken_in<R: DeserializeOwned>(
    cx: &WorkflowContext,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    recorded: &StepRow,
) -> R {
    tracing::Span::current().record("replayed", true);
    crate::telemetry::step(name, true);
    replay(cx, seq, kind, name, recorded).await
}

/// Waits, before a step body starts (or starts again), for the check of a
/// lease that may have lapsed while the run was held up (see
/// [`LeaseWatch::unless_lapsed`](super::lease_watch::LeaseWatch::unless_lapsed));
/// returns the row another run journaled for step `seq` meanwhile, which the
/// check took in, if any: that row is replayed instead of running the body.
pub(crate) async fn checked_lease(cx: &WorkflowContext, seq: i64) -> Option<StepRow> {
    cx.lease.unless_lapsed(cx.keiro.lease_ttl()).await;
    cx.recorded(seq)
}

/// Replays step `seq` from the journal, or runs `execute` (with no workflow
/// context, so nothing inside it is journaled) and records its result.
///
/// On non-determinism, an undecodable record or a store failure the run is
/// aborted through the context and this future never completes; the runner
/// drops it.
pub(crate) async fn run_step<R, Fut>(
    cx: Arc<WorkflowContext>,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    execute: Fut,
) -> R
where
    R: Serialize + DeserializeOwned,
    Fut: Future<Output = R>,
{
    run_timed(cx, seq, kind, name, async { (execute.await, None) }).await
}

tokio::task_local! {
    /// The journaled step (or other journaled call) whose body the task is
    /// running, outside its workflow's context: a transactional step
    /// called there would commit with no journal row (see
    /// `step_transaction`).
    pub(crate) static IN_STEP: StepName;
}

/// The name of the step whose body runs (see [`IN_STEP`]). A type of its
/// own: a task-local `&'static str` makes the scoped body's future `Send`
/// for one lifetime only, and the step's future then is not `Send`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepName(pub(crate) &'static str);

/// [`run_step`] for a body that says how many attempts it took: those and
/// the time the first began are journaled with its result.
async fn run_timed<R, Fut>(
    cx: Arc<WorkflowContext>,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    execute: Fut,
) -> R
where
    R: Serialize + DeserializeOwned,
    Fut: Future<Output = (R, Option<u32>)>,
{
    if let Some(recorded) = cx.recorded(seq) {
        return replay_recorded(&cx, seq, kind, name, &recorded).await;
    }
    if cx.replay_only {
        return super::beyond_history(&cx).await;
    }
    // Two callers racing on one id never both run a step: the first step
    // body runs only once the run's instance is recorded.
    super::deferred::created(&cx).await;
    if let Some(recorded) = checked_lease(&cx, seq).await {
        return replay_recorded(&cx, seq, kind, name, &recorded).await;
    }
    let span = tracing::debug_span!("keiro.step", name, seq, replayed = false);
    async move {
        let started_at = cx.keiro.now_us();
        let (value, attempts) = scope(None, IN_STEP.scope(StepName(name), execute)).await;
        // A check of a lapsed lease while the body ran (or between its
        // attempts, which then stop: see `step_retry`) may have taken in
        // the row another run journaled for this step: the body goes on
        // with that row's value, never with one the journal contradicts
        // (a pipelined run would use its own at once).
        if let Some(recorded) = cx.recorded(seq) {
            return replay_taken_in(&cx, seq, kind, name, &recorded).await;
        }
        let timing = StepTiming {
            attempts,
            started_at: attempts.map(|_| started_at),
        };
        // The first step to complete in a select's branch journals the
        // select's decision with its own row: one commit, not two.
        let won = match kind {
            StepKind::Step => super::select::claim_win(&cx),
            _ => None,
        };
        record_step(&cx, seq, kind, name, value, timing, won).await
    }
    .instrument(span)
    .await
}

/// Journals `value` as step `seq`'s result through the group-commit writer,
/// with the decision of the select whose win it claimed (`won`), if any, and
/// returns it (or the result another executor recorded first).
pub(crate) async fn record_step<R>(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    value: R,
    timing: StepTiming,
    won: Option<Won>,
) -> R
where
    R: Serialize + DeserializeOwned,
{
    match won {
        Some(won) => record_winning(cx, seq, name, value, won, timing).await,
        None => record_timed(cx, seq, kind, name, value, timing).await,
    }
}

/// Journals `value` as step `seq`'s result and returns it, or the result
/// another executor recorded first.
pub(crate) async fn record<R>(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    value: R,
) -> R
where
    R: Serialize + DeserializeOwned,
{
    record_timed(cx, seq, kind, name, value, StepTiming::default()).await
}

/// [`record`], journaling how the step's body ran with its result.
async fn record_timed<R>(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    kind: StepKind,
    name: &'static str,
    value: R,
    timing: StepTiming,
) -> R
where
    R: Serialize + DeserializeOwned,
{
    let result = match encode_result(cx, seq, kind, name, &value) {
        Ok(json) => json,
        Err(error) => return halt(cx, error).await,
    };
    let row = step_row(cx, seq, kind, name, result);
    if cx.pipelines(kind) {
        // Durable later, before anything observable (see `crate::Journal`);
        // a journaled value (`keiro::now()`) needs its instance recorded.
        super::deferred::created(cx).await;
        return match super::pipeline::enqueue(cx, row, timing) {
            Ok(()) => {
                crate::telemetry::step(name, false);
                value
            }
            Err(error) => halt(cx, error).await,
        };
    }
    // The instance recorded and the rows queued before durable first.
    super::pipeline::barrier(cx).await;
    let written = crate::retry::retrying((&cx.name, &cx.id), "a step's journal write", || {
        cx.keiro.writer().append_timed(row.clone(), timing)
    })
    .await;
    match written.0 {
        Ok(AppendOutcome::Inserted) => {
            crate::telemetry::step(name, false);
            value
        }
        // Another executor recorded this step first: its result wins.
        Ok(AppendOutcome::Existing(first)) => replay(cx, seq, kind, name, &first).await,
        Err(e) => halt(cx, Error::Store(e)).await,
    }
}

/// Step `seq`'s `value` as the journal stores it: JSON within the runtime's
/// payload limit.
pub(crate) fn encode_result<R: Serialize>(
    cx: &WorkflowContext,
    seq: i64,
    kind: StepKind,
    name: &str,
    value: &R,
) -> crate::Result<String> {
    let what = || {
        format!(
            "{} (#{seq}) of workflow `{}` id `{}` returned",
            describe(kind.as_str(), name),
            cx.name,
            cx.id
        )
    };
    let result = crate::json::to_json(value, what)?;
    check_step_size(cx, seq, kind, name, &result)?;
    Ok(result)
}

/// Refuses a step result over the runtime's payload limit.
fn check_step_size(
    cx: &WorkflowContext,
    seq: i64,
    kind: StepKind,
    name: &str,
    json: &str,
) -> crate::Result<()> {
    crate::json::check_size(json, cx.keiro.max_payload_bytes(), &cx.name, &cx.id, || {
        format!("the result of {} (#{seq})", describe(kind.as_str(), name))
    })
}

pub(crate) fn step_row(
    cx: &WorkflowContext,
    seq: i64,
    kind: StepKind,
    name: &str,
    result: String,
) -> StepRow {
    StepRow {
        workflow_id: cx.id.clone(),
        generation: cx.generation,
        seq,
        name: name.to_owned(),
        kind: kind.as_str().to_owned(),
        result,
    }
}

/// Journals step `seq`'s `value` together with the decision of the select
/// whose win it claimed (`won`), and returns it (or the result another
/// executor recorded first); tells the select which winner stands.
async fn record_winning<R>(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    name: &'static str,
    value: R,
    won: Won,
    timing: StepTiming,
) -> R
where
    R: Serialize + DeserializeOwned,
{
    let kind = StepKind::Step;
    let result = match encode_result(cx, seq, kind, name, &value) {
        Ok(json) => json,
        Err(error) => return halt(cx, error).await,
    };
    let rows = vec![
        (step_row(cx, seq, kind, name, result), timing),
        (
            step_row(
                cx,
                won.seq,
                StepKind::Select,
                "select",
                won.index.to_string(),
            ),
            StepTiming::default(),
        ),
    ];
    super::pipeline::barrier(cx).await;
    let written = crate::retry::retrying((&cx.name, &cx.id), "a select's journal write", || {
        cx.keiro.writer().append_together(rows.clone())
    })
    .await;
    let (step, decision) = match written.0 {
        Ok(outcomes) => match <[AppendOutcome; 2]>::try_from(outcomes) {
            Ok([step, decision]) => (step, decision),
            Err(_) => {
                let error = Error::Internal("the writer answered a pair with another count".into());
                return halt(cx, error).await;
            }
        },
        Err(e) => return halt(cx, Error::Store(e)).await,
    };
    let winner = match decision {
        AppendOutcome::Inserted => won.index,
        // Another executor decided this select first: its winner stands.
        AppendOutcome::Existing(first) => {
            replay(cx, won.seq, StepKind::Select, "select", &first).await
        }
    };
    won.journaled(winner);
    match step {
        AppendOutcome::Inserted => {
            crate::telemetry::step(name, false);
            value
        }
        AppendOutcome::Existing(first) => replay(cx, seq, kind, name, &first).await,
    }
}

pub(crate) async fn replay<R: DeserializeOwned>(
    cx: &WorkflowContext,
    seq: i64,
    kind: StepKind,
    name: &str,
    recorded: &StepRow,
) -> R {
    if recorded.kind != kind.as_str() || recorded.name != name {
        let found = describe(kind.as_str(), name);
        return halt(cx, cx.non_deterministic(seq, recorded, found)).await;
    }
    match serde_json::from_str(&recorded.result) {
        Ok(value) => value,
        Err(e) => {
            let what = format!(
                "the recorded result of {} (seq {seq}) of workflow `{}` (id {}) into the \
                 step's current return type",
                describe(kind.as_str(), name),
                cx.name,
                cx.id
            );
            halt(cx, Error::decode(what, e)).await
        }
    }
}

/// Aborts the run with `error` and never returns; the runner drops this future.
pub(crate) async fn halt<T>(cx: &WorkflowContext, error: Error) -> T {
    cx.abort(error);
    std::future::pending().await
}
