//! Patches: changing a workflow's code while instances recorded by the old
//! code are still in flight.
//!
//! A patch is a journal entry of kind `patch` (a *marker*) named by its patch
//! id. [`patched`] records it the first time an instance reaches the patch
//! under the new code, so every later replay answers the same; an instance
//! whose journal was recorded before the patch existed has another entry (or
//! later entries) where the marker would go, and takes the old branch without
//! claiming a step id, so its old entries still line up.

use std::future::Future;
use std::sync::Arc;

use keiro_store::{AppendOutcome, StepRow, StepTiming};

use super::{current, describe, halt, Halt, StepKind, WorkflowContext};
use crate::Error;

/// The longest patch id [`patched`] and [`deprecate_patch`] accept, in
/// bytes. A patch id is journaled as the marker's name and shown in
/// diagnostics, so it is meant to be short: `"charge-before-ship"`.
pub const MAX_PATCH_ID_BYTES: usize = 256;

/// Whether the current workflow instance runs the code of patch `patch_id`:
/// `true` for an instance that reaches this point under the patched code,
/// `false` for one whose journal was recorded before the patch existed.
///
/// Inside a workflow:
/// - past the end of the recorded journal (a new run, or a replay that has
///   caught up with it) it records a marker (a journal entry of kind
///   `patch` named `patch_id`) at the next step id and answers `true`;
/// - in a replay where the journal holds this patch's marker at that step id
///   it consumes it and answers `true`;
/// - in a replay where the journal holds another entry there, or holds no
///   entry there but later ones (it was recorded by the code before the
///   patch), it claims **no** step id and answers `false`, so the old code
///   path's entries line up with the old branch;
/// - a marker of *another* patch at that step id is non-determinism: the
///   instance is set aside ([`crate::WorkflowStatus::NonDeterministic`])
///   naming both patches.
///
/// The answer is therefore stable for the instance's life: once `true`
/// (marker recorded) always `true`, once `false` always `false`.
///
/// Like a step, whether it takes a step id is decided when it is *called*:
/// await it where you call it (`if keiro::patched("x").await { .. }`), and
/// call it before a `tokio::join!` or `keiro::select!`, not inside one of
/// their branches, so its place among the other calls is fixed.
///
/// Once no instance recorded before the patch is left, drop the old branch
/// and replace the call with [`deprecate_patch`]; once no instance holding
/// the marker is left, remove that too.
///
/// Outside a workflow there is no journal and the current code runs: it
/// answers `true`. Inside one, an empty patch id, one holding a NUL byte or
/// one longer than [`MAX_PATCH_ID_BYTES`] ends the run with
/// [`Error::InvalidId`] (`invalid patch id …`) and journals nothing; a
/// store failure ends the run as any step's would, to be resumed.
///
/// ```no_run
/// #[keiro::step]
/// async fn charge(order: String) -> Result<(), String> {
///     Ok(())
/// }
///
/// #[keiro::step]
/// async fn check_fraud(order: String) -> Result<(), String> {
///     Ok(())
/// }
///
/// #[keiro::workflow]
/// async fn checkout(order: String) -> Result<(), String> {
///     // Instances started before this deploy charge without the check;
///     // every instance started after it checks first.
///     if keiro::patched("fraud-check").await {
///         check_fraud(order.clone()).await?;
///     }
///     charge(order).await
/// }
/// ```
pub fn patched(patch_id: impl Into<String>) -> impl Future<Output = bool> + Send {
    let patch_id = patch_id.into();
    let at = locate(&patch_id, Call::Patched);
    async move {
        match at {
            Found::Outside | Found::Marker => true,
            Found::Before => false,
            Found::Record(cx, seq) => record_marker(&cx, seq, &patch_id).await,
            Found::Other(cx, seq, row) => mismatch(&cx, seq, &row, &patch_id).await,
            Found::Invalid(cx, error) => halt(&cx, Halt::Error(error)).await,
        }
    }
}

/// Retires patch `patch_id` once no instance recorded before it is left:
/// replace `if keiro::patched(id).await { new } else { old }` with
/// `keiro::deprecate_patch(id).await; new`.
///
/// A replay whose journal holds this patch's marker at this point consumes
/// it, so instances that ran [`patched`] still line up; anywhere else
/// (a new run, a journal with another entry here) it records nothing and
/// claims no step id. Once no instance holding the marker is left, remove
/// the call. A marker of *another* patch at this point is non-determinism,
/// as for [`patched`].
///
/// Outside a workflow it does nothing; a bad patch id ends the run as for
/// [`patched`].
///
/// ```no_run
/// #[keiro::step]
/// async fn charge(order: String) -> Result<(), String> {
///     Ok(())
/// }
///
/// #[keiro::step]
/// async fn check_fraud(order: String) -> Result<(), String> {
///     Ok(())
/// }
///
/// #[keiro::workflow]
/// async fn checkout(order: String) -> Result<(), String> {
///     // Every instance left was started after "fraud-check" shipped.
///     keiro::deprecate_patch("fraud-check").await;
///     check_fraud(order.clone()).await?;
///     charge(order).await
/// }
/// ```
pub fn deprecate_patch(patch_id: impl Into<String>) -> impl Future<Output = ()> + Send {
    let patch_id = patch_id.into();
    let at = locate(&patch_id, Call::Deprecated);
    async move {
        match at {
            // `locate` records nothing for a deprecated patch.
            Found::Outside | Found::Before | Found::Marker | Found::Record(..) => {}
            Found::Other(cx, seq, row) => mismatch(&cx, seq, &row, &patch_id).await,
            Found::Invalid(cx, error) => halt(&cx, Halt::Error(error)).await,
        }
    }
}

/// What the journal holds where a patch call stands.
enum Found {
    /// No workflow runs here: there is no journal, the current code runs.
    Outside,
    /// The patch id cannot be journaled: the run ends with this error.
    Invalid(Arc<WorkflowContext>, Error),
    /// An entry recorded before the patch (or entries after this point):
    /// no step id claimed.
    Before,
    /// This patch's marker, now consumed.
    Marker,
    /// Nothing, here or later: the marker is to be recorded at this step id.
    Record(Arc<WorkflowContext>, i64),
    /// Another patch's marker at this step id, now claimed.
    Other(Arc<WorkflowContext>, i64, StepRow),
}

/// Which patch call stands at a point of the code.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    /// [`patched`]: records a marker past the journal's end.
    Patched,
    /// [`deprecate_patch`]: records nothing.
    Deprecated,
}

/// Reads the journal at the current workflow's next step id for `call` of
/// patch `patch_id`, and claims that id when the journal holds a marker
/// there, or (for [`Call::Patched`]) when the journal ends before it.
fn locate(patch_id: &str, call: Call) -> Found {
    let Some(cx) = current() else {
        return Found::Outside;
    };
    if let Err(error) = Error::check_id_within("patch id", patch_id, MAX_PATCH_ID_BYTES) {
        return Found::Invalid(cx, error);
    }
    let record = call == Call::Patched;
    let claimed = cx.claim_seq_if(|seq| match cx.recorded(seq) {
        Some(row) => row.kind == StepKind::Patch.as_str(),
        None => record && cx.first_recorded_from(seq).is_none(),
    });
    let Ok(seq) = claimed else {
        return Found::Before;
    };
    match cx.recorded(seq) {
        Some(row) if row.name == patch_id => Found::Marker,
        Some(row) => Found::Other(cx, seq, row),
        None => Found::Record(cx, seq),
    }
}

/// Journals patch `patch_id`'s marker at step `seq`; `true`, unless another
/// executor recorded something else there first (non-determinism).
async fn record_marker(cx: &Arc<WorkflowContext>, seq: i64, patch_id: &str) -> bool {
    let row = StepRow {
        workflow_id: cx.id.clone(),
        generation: cx.generation,
        seq,
        name: patch_id.to_owned(),
        kind: StepKind::Patch.as_str().to_owned(),
        result: "true".to_owned(),
    };
    super::pipeline::barrier(cx).await;
    match cx
        .keiro
        .writer()
        .append_timed(row, StepTiming::default())
        .await
    {
        Ok(AppendOutcome::Inserted) => true,
        Ok(AppendOutcome::Existing(first))
            if first.kind == StepKind::Patch.as_str() && first.name == patch_id =>
        {
            true
        }
        // Another executor ran other code at this step id first.
        Ok(AppendOutcome::Existing(first)) => mismatch(cx, seq, &first, patch_id).await,
        Err(e) => halt(cx, Halt::Error(Error::Store(e))).await,
    }
}

/// Sets the instance aside: the journal holds `row` at `seq` where the code
/// calls patch `patch_id`.
async fn mismatch<T>(cx: &WorkflowContext, seq: i64, row: &StepRow, patch_id: &str) -> T {
    let found = describe(StepKind::Patch.as_str(), patch_id);
    halt(cx, Halt::Error(cx.non_deterministic(seq, row, found))).await
}
