//! The text forms of what the commands print. Their JSON forms (instance
//! summaries, journal entries, timers, status names) are
//! [`keiro::admin::json`]'s, shared with the admin API and console.

use keiro::{WaitKind, WaitingOn, WorkflowStatus, WorkflowSummary};
use serde_json::Value;

use crate::clock;

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

/// Compact JSON text of `value`, for a table cell.
pub(crate) fn compact(value: &Value) -> String {
    value.to_string()
}
