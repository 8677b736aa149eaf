//! The metrics keiro's runtime records through the [`metrics`] facade: free
//! when the application installs no recorder, exported by whichever one it
//! installs (Prometheus, OpenTelemetry, ...). Labels are bounded: workflow and
//! step names and outcomes, never ids.

use metrics::{counter, gauge};

use crate::ResumeSummary;

/// Steps run: `step` (name), `outcome` = `executed` | `replayed`.
pub const STEPS: &str = "keiro_steps_total";
/// Workflow runs that ended: `workflow`, `outcome` = `completed` | `failed` |
/// `suspended` | `set_aside` | `crashed` | `cancelled`.
pub const RUNS: &str = "keiro_workflow_runs_total";
/// Due instances found by the last resume pass.
pub const RESUME_BACKLOG: &str = "keiro_resume_backlog";
/// Instances the resume worker claimed and re-invoked.
pub const RESUMED: &str = "keiro_resume_resumed_total";
/// Claims skipped because another executor holds a live lease.
pub const LEASE_SKIPPED: &str = "keiro_resume_lease_skipped_total";
/// Instances naming a workflow this binary does not register (per pass).
pub const UNKNOWN_NAME: &str = "keiro_resume_unknown_name_total";
/// Due instances of another application version, skipped (per pass).
pub const OTHER_VERSION: &str = "keiro_resume_other_version_total";
/// Store errors met while advancing instances.
pub const TRANSIENT_ERRORS: &str = "keiro_resume_transient_errors_total";
/// Awakeables created and not yet answered, as of the last resume pass.
pub const AWAKEABLES_PENDING: &str = "keiro_awakeables_pending";
/// This process's clock minus the database server's, in seconds (positive:
/// it runs ahead), as of its last reading: on PostgreSQL, when the process
/// takes its executor identity and at every executor heartbeat (see
/// [`crate::KeiroBuilder::max_clock_skew`]). Alert on it well below that limit.
pub const CLOCK_OFFSET: &str = "keiro_clock_offset_seconds";

pub(crate) fn step(name: &'static str, replayed: bool) {
    let outcome = if replayed { "replayed" } else { "executed" };
    counter!(STEPS, "step" => name, "outcome" => outcome).increment(1);
}

pub(crate) fn run_ended(workflow: &str, outcome: &'static str) {
    counter!(RUNS, "workflow" => workflow.to_owned(), "outcome" => outcome).increment(1);
}

pub(crate) fn pass(summary: &ResumeSummary) {
    gauge!(RESUME_BACKLOG).set(summary.discovered as f64);
    counter!(RESUMED).increment(summary.resumed as u64);
    counter!(LEASE_SKIPPED).increment(summary.lease_skipped as u64);
    counter!(UNKNOWN_NAME).increment(summary.unknown_name as u64);
    counter!(TRANSIENT_ERRORS).increment(summary.transient_errors as u64);
    counter!(OTHER_VERSION).increment(summary.other_version as u64);
}

pub(crate) fn awakeables_pending(n: u64) {
    gauge!(AWAKEABLES_PENDING).set(n as f64);
}

pub(crate) fn clock_offset(offset_us: i64) {
    gauge!(CLOCK_OFFSET).set(offset_us as f64 / 1e6);
}
