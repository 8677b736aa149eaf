//! The JSON and text forms of what the commands print: instance
//! summaries, journal entries and timers.

use keiro::timers::TimerRow;
use keiro::{StepOutcome, StepRecord, WaitKind, WaitingOn, WorkflowStatus, WorkflowSummary};
use serde_json::{json, Value};

use crate::clock;

/// Every status `keiro list --status` takes, as the store spells it.
pub(crate) const STATUSES: [&str; 8] = [
    "pending",
    "running",
    "suspended",
    "completed",
    "failed",
    "cancelled",
    "timed_out",
    "nondeterministic",
];

/// The status `name` names (one of [`STATUSES`]).
pub(crate) fn parse_status(name: &str) -> Option<WorkflowStatus> {
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
pub(crate) fn status_name(status: &WorkflowStatus) -> &'static str {
    match status {
        WorkflowStatus::Pending => "pending",
        WorkflowStatus::Running => "running",
        WorkflowStatus::Suspended => "suspended",
        WorkflowStatus::Completed => "completed",
        WorkflowStatus::Failed => "failed",
        WorkflowStatus::Cancelled => "cancelled",
        WorkflowStatus::TimedOut => "timed_out",
        WorkflowStatus::NonDeterministic { .. } => "nondeterministic",
        _ => "unknown",
    }
}

/// What most needs saying about an instance in one cell: why it failed or
/// was set aside, when it is due, or who holds it.
pub(crate) fn detail(summary: &WorkflowSummary) -> String {
    if let WorkflowStatus::NonDeterministic { expected, found } = &summary.status {
        return format!("journal has {expected}, code calls {found}");
    }
    if let Some(error) = &summary.error {
        return error.clone();
    }
    if summary.status == WorkflowStatus::Failed {
        // Failed with no diagnostic: the workflow returned its `Err`,
        // which is its output.
        return "returned Err (its output: keiro show)".to_owned();
    }
    if let Some(waiting) = &summary.waiting_on {
        return waits(waiting, summary.wake_at);
    }
    if let Some(wake_at) = summary.wake_at {
        return format!("due {}", clock::short(wake_at));
    }
    if let Some(executor) = &summary.executor {
        return format!("held by {executor}");
    }
    String::new()
}

/// What a suspended instance waits on, e.g. ``awaits message on `greeting` (seq 0)``,
/// with when it is due when it is.
pub(crate) fn waits(waiting: &WaitingOn, wake_at: Option<std::time::SystemTime>) -> String {
    let seq = waiting.seq;
    let name = &waiting.name;
    let what = match waiting.kind {
        WaitKind::Sleep => {
            return match wake_at {
                Some(at) => format!("sleeps until {} (seq {seq})", clock::short(at)),
                None => format!("sleeps (seq {seq})"),
            }
        }
        WaitKind::AwakeableAnswer => format!("awaits an awakeable (seq {seq})"),
        WaitKind::Child => format!("awaits child `{name}` (seq {seq})"),
        WaitKind::Message => format!("awaits a message on `{name}` (seq {seq})"),
        other => format!("awaits {other} `{name}` (seq {seq})"),
    };
    match wake_at {
        Some(at) => format!("{what}, due {}", clock::short(at)),
        None => what,
    }
}

/// An instance summary as JSON.
pub(crate) fn summary_json(s: &WorkflowSummary) -> Value {
    let mut value = json!({
        "id": s.id,
        "name": s.name,
        "status": status_name(&s.status),
        "attempts": s.attempts,
        "generation": s.generation,
        "created_at": clock::rfc3339(s.created_at),
        "updated_at": clock::rfc3339(s.updated_at),
        "parent_id": s.parent_id,
        "error": s.error,
        "executor": s.executor,
        "wake_at": s.wake_at.map(clock::rfc3339),
        "waiting_on": s.waiting_on.as_ref().map(|w| json!({
            "seq": w.seq,
            "kind": w.kind.as_str(),
            "name": w.name,
        })),
    });
    if let WorkflowStatus::NonDeterministic { expected, found } = &s.status {
        value["nondeterminism"] = json!({ "expected": expected, "found": found });
    }
    value
}

/// `ok` or `err`.
pub(crate) fn outcome_name(outcome: StepOutcome) -> &'static str {
    match outcome {
        StepOutcome::Ok => "ok",
        StepOutcome::Err => "err",
    }
}

/// A journal entry as JSON.
pub(crate) fn step_json(step: &StepRecord) -> Value {
    json!({
        "seq": step.seq,
        "kind": step.kind,
        "name": step.name,
        "outcome": outcome_name(step.outcome),
        "value": step.value,
        "attempts": step.attempts,
        "started_at": step.started_at.map(clock::rfc3339),
        "finished_at": clock::rfc3339(step.finished_at),
        "duration_ms": step_duration(step).map(|d| d.as_secs_f64() * 1000.0),
    })
}

/// The id of the awakeable journal entry `step` of instance `id`
/// (generation `generation`) created, as keiro handed it out
/// (`<workflow id>/<generation>/<seq>/<secret>`, or without the secret for
/// awakeables older than secrets): what `keiro resolve` takes. `None` for
/// any other entry.
pub(crate) fn awakeable_id(id: &str, generation: i64, step: &StepRecord) -> Option<String> {
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

/// How long a `#[step]` took from its first attempt to its recorded
/// result, when the journal knows its start.
pub(crate) fn step_duration(step: &StepRecord) -> Option<std::time::Duration> {
    let started = step.started_at?;
    step.finished_at.duration_since(started).ok()
}

/// A timer as JSON.
pub(crate) fn timer_json(t: &TimerRow) -> Value {
    json!({
        "id": t.id.to_string(),
        "process_manager": t.process_manager,
        "correlation_id": t.correlation_id,
        "status": t.status.as_str(),
        "fire_at": clock::rfc3339(t.fire_at),
        "attempts": t.attempts,
        "last_error": t.last_error,
        "event_id": t.event_id,
        "claimed_at": t.claimed_at.map(clock::rfc3339),
        "resume_lease_until": t.resume_lease_until.map(clock::rfc3339),
        "created_at": clock::rfc3339(t.created_at),
        "updated_at": clock::rfc3339(t.updated_at),
        "payload": t.payload,
    })
}

/// Compact JSON text of `value`, for a table cell.
pub(crate) fn compact(value: &Value) -> String {
    value.to_string()
}

/// Stored JSON text as a value (kept as a string when it is not JSON).
pub(crate) fn stored(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}
