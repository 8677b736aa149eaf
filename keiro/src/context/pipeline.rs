//! The pipelined journal ([`crate::Journal::Pipelined`]): a run's step rows
//! queue here and commit behind its next steps, one batch at a time, and a
//! barrier ([`settle`]) waits until all are durable. The rows still queued
//! when the run returns commit with its end instead ([`take_rest`]), in one
//! transaction.
//!
//! Order: one flush of a run is in flight at a time, and it hands the
//! writer every row queued so far as one chain
//! (`JournalWriter::append_chain`), which commits them in one transaction.
//! So the rows of a run commit in the order they were queued, and the
//! journal is always a prefix of what the run computed: never a later row
//! without an earlier one, and none behind a row another executor
//! journaled first (the chain stops there). Every other journaled
//! operation of the run waits for [`settle`] first, so it commits after
//! them too.

use std::sync::{Arc, Mutex};

use keiro_store::{AppendOutcome, StepRow, StepTiming};
use tokio::sync::Notify;

use super::{Halt, WorkflowContext};
use crate::runtime::lock;
use crate::Error;

/// A pipelined run's rows not yet durable.
#[derive(Default)]
pub(crate) struct Pipeline {
    state: Mutex<State>,
    /// Told whenever a flush ends (drained, or failed).
    settled: Notify,
}

#[derive(Default)]
struct State {
    /// Rows queued since the flush in flight took its batch.
    queued: Vec<(StepRow, StepTiming)>,
    /// Whether a flush task is running.
    flushing: bool,
    /// Whether the run returned: the flush in flight takes no further batch,
    /// the rows left commit with the run's end.
    ending: bool,
    /// The first write that failed: the run stops, and nothing more of it
    /// is written.
    failed: Option<Error>,
    /// Whether that failure was a row another executor journaled first.
    lease_lost: bool,
}

/// What stopped a flush: an error for its waiters, and whether the run lost
/// its lease (else it halts with the error).
struct Failure {
    error: Error,
    lease_lost: bool,
}

/// Queues `row` of `cx`'s pipelined run, starting a flush unless one runs:
/// the caller's step returns at once. Refused with the error that stopped
/// an earlier flush.
pub(crate) fn enqueue(
    cx: &Arc<WorkflowContext>,
    row: StepRow,
    timing: StepTiming,
) -> Result<(), Error> {
    let Some(pipeline) = &cx.pipeline else {
        return Err(Error::Internal(
            "a step row was queued for a run that journals strictly".into(),
        ));
    };
    let mut state = lock(&pipeline.state);
    if let Some(error) = &state.failed {
        return Err(error.clone());
    }
    if state.ending {
        return Err(Error::Internal(
            "a step row was queued after its run returned".into(),
        ));
    }
    state.queued.push((row, timing));
    if !state.flushing {
        state.flushing = true;
        drop(state);
        tokio::spawn(flush(cx.clone()));
    }
    Ok(())
}

/// Waits until every row `cx`'s run queued is durable (at once for a run
/// that journals strictly): with [`barrier`], what stands before anything
/// observable and before every other journaled operation. The error is the
/// one that stopped a flush; the run is halted with it already.
pub(crate) async fn settle(cx: &WorkflowContext) -> Result<(), Error> {
    let Some(pipeline) = &cx.pipeline else {
        return Ok(());
    };
    loop {
        // Registered before the state is read, so a flush ending in between
        // still wakes this wait.
        let ended = pipeline.settled.notified();
        {
            let state = lock(&pipeline.state);
            if let Some(error) = &state.failed {
                return Err(error.clone());
            }
            if !state.flushing && state.queued.is_empty() {
                return Ok(());
            }
        }
        ended.await;
    }
}

/// After [`settle`] failed: whether the run lost its lease (another
/// executor journaled one of its steps first), so it must end recording
/// nothing; otherwise the failure was a store error.
pub(crate) fn lost_lease(cx: &WorkflowContext) -> bool {
    cx.pipeline
        .as_ref()
        .is_some_and(|pipeline| lock(&pipeline.state).lease_lost)
}

/// The run's instance recorded (see [`super::deferred`]) and then
/// [`settle`], stopping the run (and never returning) when either failed:
/// what a journaled operation calls before its own write.
pub(crate) async fn barrier(cx: &WorkflowContext) {
    super::deferred::created(cx).await;
    if let Err(error) = settle(cx).await {
        // The flush halted the run already; this only ends the caller.
        super::halt::<()>(cx, Halt::Error(error)).await;
    }
}

/// For a run that lost its lease: the flush in flight takes no further
/// batch (nothing more of the run is journaled after it).
pub(crate) fn abandon(cx: &WorkflowContext) {
    if let Some(pipeline) = &cx.pipeline {
        lock(&pipeline.state).ending = true;
    }
}

/// For a pipelined run that returned (none queued for a strict one): waits
/// for the flush in flight to end its batch (it takes no further one), then
/// takes the rows still queued, which the run's end commits with it in one
/// transaction, after the flushed ones, so the journal stays a prefix of
/// the run. The error is the one that stopped a flush.
pub(crate) async fn take_rest(cx: &WorkflowContext) -> Result<Vec<(StepRow, StepTiming)>, Error> {
    let Some(pipeline) = &cx.pipeline else {
        return Ok(Vec::new());
    };
    loop {
        let ended = pipeline.settled.notified();
        {
            let mut state = lock(&pipeline.state);
            if let Some(error) = &state.failed {
                return Err(error.clone());
            }
            state.ending = true;
            if !state.flushing {
                return Ok(std::mem::take(&mut state.queued));
            }
        }
        ended.await;
    }
}

/// Commits `cx`'s queued rows batch after batch until none is left (or the
/// run returned: see [`take_rest`]), then marks the pipeline idle. A batch
/// is written once: no driver stops this task when the lease may lapse, so
/// a failed write stops the run (which resumes from its journal) rather
/// than trying again past the lease.
async fn flush(cx: Arc<WorkflowContext>) {
    let Some(pipeline) = &cx.pipeline else { return };
    loop {
        let batch = {
            let mut state = lock(&pipeline.state);
            if state.queued.is_empty() || state.ending {
                state.flushing = false;
                drop(state);
                pipeline.settled.notify_waiters();
                return;
            }
            std::mem::take(&mut state.queued)
        };
        let written = cx.keiro.writer().append_chain(batch).await;
        if let Some(Failure { error, lease_lost }) = failure(&cx, written) {
            {
                let mut state = lock(&pipeline.state);
                state.failed = Some(error.clone());
                state.lease_lost = lease_lost;
                state.queued.clear();
                state.flushing = false;
            }
            pipeline.settled.notify_waiters();
            cx.halt(match lease_lost {
                true => Halt::LeaseLost,
                false => Halt::Error(error),
            });
            return;
        }
    }
}

/// Why a batch's write stops the run, if it does: a store error (the run
/// ends without counting a crash and resumes from the journal), or a row
/// another executor recorded first (this run lost its lease, and the steps
/// after that row may have used the value it computed instead).
fn failure(
    cx: &WorkflowContext,
    written: keiro_store::Result<Vec<AppendOutcome>>,
) -> Option<Failure> {
    let outcomes = match written {
        Ok(outcomes) => outcomes,
        Err(error) => {
            return Some(Failure {
                error: Error::Store(error),
                lease_lost: false,
            });
        }
    };
    let seq = outcomes.iter().find_map(|outcome| match outcome {
        AppendOutcome::Inserted => None,
        AppendOutcome::Existing(first) => Some(first.seq),
    })?;
    tracing::warn!(
        name = %cx.name,
        id = %cx.id,
        seq,
        "keiro stopped a pipelined run: another executor journaled its step first"
    );
    Some(Failure {
        lease_lost: true,
        error: Error::Internal(format!(
            "step #{seq} of workflow `{}` id `{}` was journaled by another executor first; \
             this pipelined run stopped",
            cx.name, cx.id
        )),
    })
}
