//! A deferred create: a workflow awaited in the runtime that runs it starts
//! before its instance is recorded. Nobody outside this process has been
//! told about it, so until something of the run must be durable, a crash
//! loses nothing anyone relied on: it is as if the call never started.
//!
//! The instance is recorded (with this run's lease) before the first step
//! body runs and before any other journaled operation ([`created`]): so two
//! callers racing on one id never both run a step, and every journal row
//! has its instance. A run that returns before that records its instance
//! already ended, in one commit (`JournalWriter::create_ended`).

use keiro_store::CreateRequest;

use super::{Halt, WorkflowContext};
use crate::runtime::lock;
use crate::Error;

/// The create a run defers, and the turn of whoever records it.
#[derive(Default)]
pub(crate) struct Deferred {
    /// The instance to record; `None` once recorded (or never deferred).
    pending: std::sync::Mutex<Option<CreateRequest>>,
    /// Held while recording, so concurrent operations record it once.
    turn: tokio::sync::Mutex<()>,
}

impl Deferred {
    /// Defers `request` until the run needs it (before its body starts).
    pub(crate) fn defer(&self, request: CreateRequest) {
        *lock(&self.pending) = Some(request);
    }

    /// Whether the instance is not recorded yet.
    pub(crate) fn is_pending(&self) -> bool {
        lock(&self.pending).is_some()
    }

    /// The create still pending, taken: the run's end records it itself.
    pub(crate) fn take(&self) -> Option<CreateRequest> {
        lock(&self.pending).take()
    }
}

/// Records `cx`'s deferred instance if it is still pending. `Err` is how the
/// run must stop: the id was taken by another call meanwhile (the run
/// records nothing, as one that lost its lease), or the write failed.
pub(crate) async fn ensure(cx: &WorkflowContext) -> Result<(), Halt> {
    if !cx.deferred.is_pending() {
        return Ok(());
    }
    let _turn = cx.deferred.turn.lock().await;
    let Some(request) = lock(&cx.deferred.pending).clone() else {
        return Ok(());
    };
    let (created, retried) =
        crate::retry::retrying((&cx.name, &cx.id), "recording a new instance", || {
            cx.keiro.writer().create(request.clone())
        })
        .await;
    match created {
        Ok((_, true)) => {
            *lock(&cx.deferred.pending) = None;
            Ok(())
        }
        // A try that failed had committed after all: the row is this run's
        // (no other call in this process drives the id, and another
        // process's call would not hold this runtime's lease).
        Ok((row, false)) if retried && row.lease_owner.as_deref() == Some(cx.keiro.owner()) => {
            *lock(&cx.deferred.pending) = None;
            Ok(())
        }
        Ok((_, false)) => {
            tracing::debug!(
                name = %cx.name,
                id = %cx.id,
                "keiro: another call recorded this id first; this run stops and follows it"
            );
            Err(Halt::LeaseLost)
        }
        Err(error) => Err(Halt::Error(Error::Store(error))),
    }
}

/// [`ensure`], stopping the run (and never returning) when it fails: what a
/// step calls before its body runs, and every journaled operation before
/// its write.
pub(crate) async fn created(cx: &WorkflowContext) {
    if let Err(halt) = ensure(cx).await {
        super::halt::<()>(cx, halt).await;
    }
}
