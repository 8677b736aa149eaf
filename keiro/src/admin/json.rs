//! The JSON shapes of what the admin API, the console and the `keiro`
//! command show: instance summaries, journal entries and timers, with
//! statuses spelled as the store spells them and times in RFC 3339 (UTC,
//! microseconds: `2026-12-03T12:38:05.123456Z`). One definition, so every
//! tool prints the same document for the same row.

mod time;

use std::time::Duration;

use serde_json::{json, Value};

pub use time::rfc3339;

use crate::timers::TimerRow;
use crate::{StepOutcome, StepRecord, WorkflowStatus, WorkflowSummary};

/// Every status name [`parse_status`] takes and [`status_name`] returns.
pub const STATUSES: [&str; 8] = [
    "pending",
    "running",
    "suspended",
    "completed",
    "failed",
    "cancelled",
    "timed_out",
    "nondeterministic",
];

/// The status `name` (one of [`STATUSES`], surrounding blanks ignored)
/// names; `None` for any other text. `nondeterministic` gives
/// [`WorkflowStatus::NonDeterministic`] with empty step descriptions, which
/// is what a [`crate::ListFilter`] needs.
pub fn parse_status(name: &str) -> Option<WorkflowStatus> {
    Some(match name.trim() {
        "pending" => WorkflowStatus::Pending,
        "running" => WorkflowStatus::Running,
        "suspended" => WorkflowStatus::Suspended,
        "completed" => WorkflowStatus::Completed,
        "failed" => WorkflowStatus::Failed,
        "cancelled" => WorkflowStatus::Cancelled,
        "timed_out" => WorkflowStatus::TimedOut,
        "nondeterministic" => WorkflowStatus::NonDeterministic {
            expected: String::new(),
            found: String::new(),
        },
        _ => return None,
    })
}

/// A status as [`STATUSES`] spells it.
pub fn status_name(status: &WorkflowStatus) -> &'static str {
    match status {
        WorkflowStatus::Pending => "pending",
        WorkflowStatus::Running => "running",
        WorkflowStatus::Suspended => "suspended",
        WorkflowStatus::Completed => "completed",
        WorkflowStatus::Failed => "failed",
        WorkflowStatus::Cancelled => "cancelled",
        WorkflowStatus::TimedOut => "timed_out",
        WorkflowStatus::NonDeterministic { .. } => "nondeterministic",
    }
}

/// An instance summary: `id`, `name`, `status`, `attempts`, `generation`,
/// `created_at`, `updated_at`, `parent_id`, `error`, `executor`, `wake_at`,
/// `waiting_on` (`{seq, kind, name}` or `null`), `traceparent`, `version`,
/// `queue` (`null` on the default queue), `debounce_key` (`null` unless it
/// was debounced and not retried, requeued or continued as new since), and
/// for a set-aside
/// instance `nondeterminism` (`{expected, found}`).
pub fn summary(s: &WorkflowSummary) -> Value {
    let mut value = json!({
        "id": s.id,
        "name": s.name,
        "status": status_name(&s.status),
        "attempts": s.attempts,
        "generation": s.generation,
        "created_at": rfc3339(s.created_at),
        "updated_at": rfc3339(s.updated_at),
        "parent_id": s.parent_id,
        "error": s.error,
        "executor": s.executor,
        "wake_at": s.wake_at.map(rfc3339),
        "waiting_on": s.waiting_on.as_ref().map(|w| json!({
            "seq": w.seq,
            "kind": w.kind.as_str(),
            "name": w.name,
        })),
        "traceparent": s.traceparent,
        "version": s.version,
        "queue": s.queue,
        "debounce_key": s.debounce_key,
    });
    if let WorkflowStatus::NonDeterministic { expected, found } = &s.status {
        value["nondeterminism"] = json!({ "expected": expected, "found": found });
    }
    value
}

/// `ok` or `err`.
pub fn outcome_name(outcome: StepOutcome) -> &'static str {
    match outcome {
        StepOutcome::Ok => "ok",
        StepOutcome::Err => "err",
    }
}

/// A journal entry, with what a timeline draws: `seq`, `kind`, `name`,
/// `outcome` (`ok`/`err`), `value` (the result, or the error for `err`),
/// `attempts`, `started_at` (a `#[step]`'s first attempt), `finished_at`
/// (when it was recorded) and `duration_ms` (between the two; `null` when
/// the start is unknown).
pub fn step(step: &StepRecord) -> Value {
    json!({
        "seq": step.seq,
        "kind": step.kind,
        "name": step.name,
        "outcome": outcome_name(step.outcome),
        "value": step.value,
        "attempts": step.attempts,
        "started_at": step.started_at.map(rfc3339),
        "finished_at": rfc3339(step.finished_at),
        "duration_ms": step_duration(step).map(|d| d.as_secs_f64() * 1000.0),
    })
}

/// How long a `#[step]` took from its first attempt to its recorded
/// result, when the journal knows its start.
pub fn step_duration(step: &StepRecord) -> Option<Duration> {
    let started = step.started_at?;
    step.finished_at.duration_since(started).ok()
}

/// The id of the awakeable that journal entry `step` of instance `id`
/// (generation `generation`) created, as keiro handed it out
/// (`<workflow id>/<generation>/<seq>/<secret>`, or without the secret for
/// awakeables older than secrets): what answering it takes. `None` for any
/// other entry.
pub fn awakeable_id(id: &str, generation: i64, step: &StepRecord) -> Option<String> {
    if step.kind != "awakeable" {
        return None;
    }
    let seq = step.seq;
    match &step.value {
        Value::Object(fields) => {
            let secret = fields.get("secret")?.as_str()?;
            Some(format!("{id}/{generation}/{seq}/{secret}"))
        }
        Value::String(_) => Some(format!("{id}/{generation}/{seq}")),
        _ => None,
    }
}

/// A timer: `id`, `process_manager`, `correlation_id`, `status`,
/// `fire_at`, `attempts`, `last_error`, `event_id`, `claimed_at`,
/// `resume_lease_until`, `created_at`, `updated_at` and `payload`.
pub fn timer(t: &TimerRow) -> Value {
    json!({
        "id": t.id.to_string(),
        "process_manager": t.process_manager,
        "correlation_id": t.correlation_id,
        "status": t.status.as_str(),
        "fire_at": rfc3339(t.fire_at),
        "attempts": t.attempts,
        "last_error": t.last_error,
        "event_id": t.event_id,
        "claimed_at": t.claimed_at.map(rfc3339),
        "resume_lease_until": t.resume_lease_until.map(rfc3339),
        "created_at": rfc3339(t.created_at),
        "updated_at": rfc3339(t.updated_at),
        "payload": t.payload,
    })
}

/// Stored JSON text (an input, an output, a message) as a value; text that
/// is not JSON is kept as a JSON string.
pub fn stored(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_name_parses_back() {
        for name in STATUSES {
            let status = parse_status(name).unwrap();
            assert_eq!(status_name(&status), name);
        }
        assert_eq!(parse_status(" failed "), Some(WorkflowStatus::Failed));
        assert_eq!(parse_status("done"), None);
    }
}
