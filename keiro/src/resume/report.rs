//! What the resume worker reports: one [`ResumeEvent`] per notable thing,
//! and a [`ResumeSummary`] per pass.

use std::sync::Arc;

use crate::{Error, GcSummary};

/// What the worker reports to its log hook.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ResumeEvent {
    /// An instance names a workflow this binary does not register. It is
    /// skipped (never dropped or failed) and reported on every pass.
    UnknownName {
        /// The stored workflow name.
        name: String,
        /// The instance id.
        id: String,
    },
    /// An instance was started by a workflow of a name this binary registers,
    /// but with other argument or return types (another binary's workflow of
    /// that name, or this one before its types changed). It is skipped (never
    /// claimed, failed or counted as a crash) and reported on every pass.
    SignatureMismatch {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The signature recorded with the instance.
        stored: String,
        /// The signature of the workflow this binary registers under the name.
        registered: String,
    },
    /// Due instances run under an application version this worker neither
    /// has nor declares compatible: they wait for a worker of that version,
    /// or for [`crate::Keiro::retarget`]. Reported once per version and pass.
    OtherVersion {
        /// Their version.
        version: String,
        /// How many of them are due (among the first 100 unclaimable ones a
        /// pass reports).
        due: usize,
        /// This worker's version.
        own: String,
    },
    /// Another live worker declares one of this worker's queues with other
    /// limits (mid-deploy, or two binaries that disagree): each worker
    /// claims within its own, so the queue holds its declared limits only
    /// once every worker runs the same declaration. Reported once per queue
    /// and worker, when this worker starts.
    QueueLimitsDiffer {
        /// The queue.
        queue: String,
        /// The other worker's executor id.
        executor: String,
        /// Its limits.
        theirs: String,
        /// This worker's.
        ours: String,
    },
    /// The store failed while advancing an instance; it is retried next pass.
    TransientError {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// What failed.
        error: Error,
    },
    /// A run crashed (panicked, or its stored data no longer decodes); it is
    /// retried after a backoff.
    Crashed {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// Why.
        error: Error,
    },
    /// An instance reached its crash-attempt ceiling and is now failed.
    MarkedFailed {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The last crash.
        message: String,
    },
    /// A pass, or part of it, failed: a claim of one source (the default
    /// queue or a named one) or the read of what the worker cannot run
    /// could not reach the store. The pass drives what its other claims
    /// took; one that claimed nothing fails whole.
    PassFailed {
        /// What failed.
        error: Error,
    },
    /// A pass ended.
    Pass(ResumeSummary),
    /// The periodic gc ([`crate::ResumeOptions::retention`]) ran.
    Gc(GcSummary),
    /// The periodic gc failed; it runs again next interval.
    GcFailed {
        /// What failed.
        error: Error,
    },
}

impl ResumeEvent {
    /// What went wrong, as a [`enum@Error`] (whose sentence says what to do):
    /// an unknown name is [`Error::UnknownWorkflow`], a signature mismatch
    /// [`Error::SignatureMismatch`], an instance marked failed
    /// [`Error::Failed`]; `None` for [`ResumeEvent::Pass`] and
    /// [`ResumeEvent::Gc`].
    pub fn error(&self) -> Option<Error> {
        match self {
            ResumeEvent::UnknownName { name, id } => Some(Error::UnknownWorkflow {
                name: name.clone(),
                id: id.clone(),
            }),
            ResumeEvent::SignatureMismatch {
                name,
                id,
                stored,
                registered,
            } => Some(Error::SignatureMismatch {
                name: name.clone(),
                id: id.clone(),
                stored: stored.clone(),
                requested: registered.clone(),
            }),
            ResumeEvent::MarkedFailed { name, id, message } => Some(Error::Failed {
                name: name.clone(),
                id: id.clone(),
                message: message.clone(),
            }),
            ResumeEvent::TransientError { error, .. }
            | ResumeEvent::Crashed { error, .. }
            | ResumeEvent::PassFailed { error }
            | ResumeEvent::GcFailed { error } => Some(error.clone()),
            ResumeEvent::Pass(_)
            | ResumeEvent::Gc(_)
            | ResumeEvent::OtherVersion { .. }
            | ResumeEvent::QueueLimitsDiffer { .. } => None,
        }
    }
}

/// A hook receiving every [`ResumeEvent`].
pub type ResumeLog = Arc<dyn Fn(&ResumeEvent) + Send + Sync>;

/// The default [`ResumeLog`]: every event to `tracing`.
pub(super) fn log_to_tracing(event: &ResumeEvent) {
    match event {
        ResumeEvent::UnknownName { name, id } => tracing::warn!(
            %name, %id,
            "keiro resume worker: {}; skipping",
            Error::UnknownWorkflow { name: name.clone(), id: id.clone() }
        ),
        ResumeEvent::SignatureMismatch {
            name,
            id,
            stored,
            registered,
        } => tracing::warn!(
            %name, %id, %stored, %registered,
            "keiro resume worker: workflow `{name}` (id {id}) was started with types `{stored}`, \
             but this binary registers `{name}` with `{registered}`; skipping"
        ),
        ResumeEvent::OtherVersion { version, due, own } => tracing::info!(
            %version, due, %own,
            "keiro resume worker: {due} due instance(s) of application version `{version}` wait \
             for a worker of that version (this one is `{own}`); `keiro retarget --from \
             {version} --to {own}` moves them here"
        ),
        ResumeEvent::QueueLimitsDiffer {
            queue,
            executor,
            theirs,
            ours,
        } => tracing::warn!(
            %queue, %executor, %theirs, %ours,
            "keiro resume worker: queue `{queue}` is declared with other limits by live worker \
             `{executor}` ({theirs}) than here ({ours}); each worker claims within its own, so \
             the queue holds its limits only once every worker runs the same declaration"
        ),
        ResumeEvent::TransientError { name, id, error } => {
            tracing::warn!(%name, %id, %error, "keiro resume worker: transient store error")
        }
        ResumeEvent::Crashed { name, id, error } => {
            tracing::warn!(%name, %id, %error, "keiro resume worker: workflow crashed; will retry")
        }
        ResumeEvent::MarkedFailed { name, id, message } => tracing::error!(
            %name, %id, %message,
            "keiro resume worker: workflow failed after its crash attempts"
        ),
        ResumeEvent::PassFailed { error } => tracing::warn!(
            %error,
            "keiro resume worker: a claim or read of a pass failed (the pass drives what its \
             other claims took; it fails whole only when it claimed nothing)"
        ),
        ResumeEvent::Gc(summary) => tracing::info!(
            instances = summary.instances,
            steps = summary.steps,
            messages = summary.messages,
            events = summary.events,
            stream_entries = summary.stream_entries,
            timers = summary.timers,
            old_generation_steps = summary.old_generation_steps,
            batches = summary.batches,
            "keiro resume worker: gc done"
        ),
        ResumeEvent::GcFailed { error } => {
            tracing::warn!(%error, "keiro resume worker: gc failed; retrying next interval")
        }
        ResumeEvent::Pass(summary) => tracing::debug!(
            discovered = summary.discovered,
            resumed = summary.resumed,
            completed = summary.completed,
            timed_out = summary.timed_out,
            cancelled = summary.cancelled,
            still_suspended = summary.still_suspended,
            unknown_name = summary.unknown_name,
            failed = summary.failed,
            transient_errors = summary.transient_errors,
            lease_skipped = summary.lease_skipped,
            other_version = summary.other_version,
            "keiro resume pass"
        ),
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumeSummary {
    /// Due instances found.
    pub discovered: usize,
    /// Instances claimed and re-invoked.
    pub resumed: usize,
    /// Re-invoked instances that finished (returned `Ok` or `Err`).
    pub completed: usize,
    /// Re-invoked instances that ended at their deadline (or an
    /// ancestor's) instead.
    pub timed_out: usize,
    /// Re-invoked instances found cancelled when they stopped.
    pub cancelled: usize,
    /// Re-invoked instances that are waiting again.
    pub still_suspended: usize,
    /// Instances whose workflow name this binary does not register, or
    /// registers with other argument/return types.
    pub unknown_name: usize,
    /// Instances marked failed (crash ceiling) or set aside (non-determinism).
    pub failed: usize,
    /// Store errors; those instances are retried next pass.
    pub transient_errors: usize,
    /// Instances another executor holds a live lease on (or this process
    /// runs already).
    pub lease_skipped: usize,
    /// Due instances skipped because they run under an application version
    /// this worker neither has nor declares compatible (see
    /// [`crate::Keiro::app_version`]); never dropped, each such version is
    /// logged once per pass ([`ResumeEvent::OtherVersion`]).
    pub other_version: usize,
}

impl ResumeSummary {
    /// The sum of two summaries.
    pub(super) fn add(mut self, other: ResumeSummary) -> ResumeSummary {
        self.discovered += other.discovered;
        self.resumed += other.resumed;
        self.completed += other.completed;
        self.timed_out += other.timed_out;
        self.cancelled += other.cancelled;
        self.still_suspended += other.still_suspended;
        self.unknown_name += other.unknown_name;
        self.failed += other.failed;
        self.transient_errors += other.transient_errors;
        self.lease_skipped += other.lease_skipped;
        self.other_version += other.other_version;
        self
    }
}
