//! One instance's page: its summary, input and output, the step timeline,
//! its children, and the operation forms.

use std::time::{Duration, SystemTime};

use axum::extract::{OriginalUri, Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;

use super::html::{self, escape, url_component, Section};
use super::list::{is_live, table};
use super::{failure_page, html_response, Request};
use crate::admin::api::detail::{Detail, DETAIL_LIMIT};
use crate::admin::json::{self, status_name};
use crate::admin::Shared;
use crate::{StepOutcome, StepRecord, WorkflowStatus, WorkflowSummary};

/// `GET /instances/{id}`.
pub(super) async fn page(
    State(state): State<Shared>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    Path(id): Path<String>,
) -> Response {
    let request = Request::new(&state, &original, &seen);
    let detail = match Detail::load(&state.keiro, &id).await {
        Ok(detail) => detail,
        Err(error) => return failure_page(&request, Section::Instances, error),
    };
    let summary = &detail.summary;
    let steps = &detail.steps;
    let base = &request.base;
    let live = if is_live(&summary.status) {
        " data-live"
    } else {
        ""
    };
    let mut body = format!("<div id=\"summary\" data-refresh=\"summary\"{live}>");
    body.push_str(&facts(base, summary));
    body.push_str("</div>");
    body.push_str(&actions(&request, summary));
    body.push_str(&format!(
        "<h2>Steps <small>generation {}</small></h2>",
        summary.generation
    ));
    body.push_str(&timeline(summary, steps));
    body.push_str(&format!(
        "<div id=\"values\" data-refresh=\"values\"><h2>Input</h2><div id=\"input\">{}</div>",
        html::json_block(&detail.input)
    ));
    if let Some(output) = &detail.output {
        body.push_str(&format!(
            "<h2>Output</h2><div id=\"output\">{}</div>",
            html::json_block(output)
        ));
    }
    body.push_str("</div>");
    body.push_str(&waiting(&request, &detail));
    if !detail.children.is_empty() {
        body.push_str("<h2>Children</h2>");
        body.push_str(&table(base, &detail.children));
        if detail.children_next_cursor.is_some() {
            body.push_str(&format!(
                "<p><a href=\"{}\">All children</a> (the first {DETAIL_LIMIT} are shown).</p>",
                escape(&format!(
                    "{}/api/instances?parent_id={}",
                    base,
                    url_component(&id)
                ))
            ));
        }
    }
    body.push_str(&forms(&request, summary, steps));
    let title = format!("{} · {}", summary.name, summary.id);
    html_response(
        StatusCode::OK,
        html::page(&request.frame(), Section::Instances, &title, &body),
    )
}

/// The summary as a definition list.
fn facts(base: &str, s: &WorkflowSummary) -> String {
    let status = status_name(&s.status);
    let mut rows = vec![
        (
            "id",
            format!("<code id=\"instance-id\">{}</code>", escape(&s.id)),
        ),
        ("workflow", escape(&s.name)),
        (
            "status",
            format!(
                "<span id=\"status\" class=\"status {status}\">{}</span>",
                status.replace('_', " ")
            ),
        ),
        ("created", html::time(s.created_at)),
        ("updated", html::time(s.updated_at)),
        ("attempts", s.attempts.to_string()),
        ("generation", s.generation.to_string()),
    ];
    if let Some(parent) = &s.parent_id {
        rows.push((
            "parent",
            format!(
                "<a href=\"{}/instances/{}\">{}</a>",
                escape(base),
                escape(&url_component(parent)),
                escape(parent)
            ),
        ));
    }
    if let Some(executor) = &s.executor {
        rows.push(("held by", escape(executor)));
    }
    if let Some(traceparent) = &s.traceparent {
        // `00-<trace id>-<span id>-<flags>`: the trace id is what tracing
        // backends search by.
        let trace = traceparent.split('-').nth(1).unwrap_or(traceparent);
        rows.push((
            "trace",
            format!(
                "<code id=\"trace-id\" title=\"traceparent {}\">{}</code>",
                escape(traceparent),
                escape(trace)
            ),
        ));
    }
    if let Some(waiting) = &s.waiting_on {
        rows.push((
            "waits on",
            format!(
                "{} <code>{}</code> (seq {})",
                waiting.kind,
                escape(&waiting.name),
                waiting.seq
            ),
        ));
    }
    if let Some(wake_at) = s.wake_at {
        rows.push(("due", html::time(wake_at)));
    }
    if let WorkflowStatus::NonDeterministic { expected, found } = &s.status {
        rows.push((
            "set aside",
            format!(
                "the journal has {}, the code calls {}",
                escape(expected),
                escape(found)
            ),
        ));
    }
    if let Some(error) = &s.error {
        rows.push((
            "error",
            format!("<pre id=\"error\">{}</pre>", escape(error)),
        ));
    }
    let mut out = String::from("<dl class=\"facts\">");
    for (term, value) in rows {
        out.push_str(&format!("<dt>{term}</dt><dd>{value}</dd>"));
    }
    out.push_str("</dl>");
    out
}

/// The buttons for the status's transitions (cancel, retry, resume); the
/// script sends them to the JSON API with the token. Without a token
/// configured they are drawn disabled.
fn actions(request: &Request, s: &WorkflowSummary) -> String {
    let id = url_component(&s.id);
    let disabled = disabled(request);
    let button = |op: &str, label: &str, title: &str| {
        format!(
            "<form class=\"op\" data-op=\"instances/{id}/{op}\" data-shape=\"none\">\
             <button type=\"submit\" id=\"op-{op}\" title=\"{title}\"{disabled}>{label}</button></form>"
        )
    };
    let mut out = String::from("<div class=\"actions\" id=\"ops\">");
    if is_live(&s.status) {
        out.push_str(&button(
            "cancel",
            "Cancel",
            "cancel this instance and its children",
        ));
    }
    if matches!(
        s.status,
        WorkflowStatus::Failed | WorkflowStatus::Cancelled | WorkflowStatus::TimedOut
    ) {
        out.push_str(&button(
            "retry",
            "Retry",
            "run it again from its journal: recorded steps are not run again",
        ));
    }
    if matches!(s.status, WorkflowStatus::NonDeterministic { .. }) {
        out.push_str(&button(
            "resume",
            "Resume",
            "put a set-aside instance back to run",
        ));
    }
    out.push_str("</div>");
    out
}

fn disabled(request: &Request) -> &'static str {
    if request.writable {
        ""
    } else {
        " disabled"
    }
}

/// The forms of operations that take input: fork, send a message, answer
/// an awakeable.
fn forms(request: &Request, s: &WorkflowSummary, steps: &[StepRecord]) -> String {
    let id = url_component(&s.id);
    let disabled = disabled(request);
    let mut out = String::from("<section class=\"ops\" id=\"forms\"><h2>Operations</h2>");
    if !steps.is_empty() {
        let last = steps.last().map(|step| step.seq).unwrap_or(0);
        out.push_str(&format!(
            "<form class=\"op\" data-op=\"instances/{id}/fork\" data-shape=\"fork\">\
             <label>Fork from step <input name=\"from_step\" type=\"number\" min=\"0\" max=\"{last}\" \
             value=\"{last}\" required></label>\
             <label>as id <input name=\"new_id\" placeholder=\"(generated)\"></label>\
             <button type=\"submit\" id=\"op-fork\"{disabled}>Fork</button></form>"
        ));
    }
    if is_live(&s.status) {
        out.push_str(&format!(
            "<form class=\"op\" data-op=\"instances/{id}/messages\" data-shape=\"message\">\
             <label>Send on topic <input name=\"topic\" required></label>\
             <label>value (JSON) <input name=\"value\" value=\"null\" required></label>\
             <button type=\"submit\" id=\"op-send\"{disabled}>Send</button></form>"
        ));
    }
    out.push_str("</section>");
    out
}

/// When a journal entry started: a step's first attempt, else when it was
/// recorded.
fn began(step: &StepRecord) -> SystemTime {
    step.started_at.unwrap_or(step.finished_at)
}

fn since(from: SystemTime, to: SystemTime) -> Duration {
    to.duration_since(from).unwrap_or_default()
}

/// The journal as a timeline: each entry's start (from the instance's
/// creation), duration, attempts, outcome and value, with a bar placing it
/// in the run.
fn timeline(s: &WorkflowSummary, steps: &[StepRecord]) -> String {
    if steps.is_empty() {
        return "<p class=\"empty\" id=\"steps\" data-refresh=\"steps\">No steps recorded yet.</p>"
            .to_owned();
    }
    let start = steps.iter().map(began).fold(s.created_at, SystemTime::min);
    let end = steps
        .iter()
        .map(|step| step.finished_at)
        .fold(start, SystemTime::max);
    let span = since(start, end).as_secs_f64().max(1e-6);
    let mut out = String::from(
        "<table class=\"steps\" id=\"steps\" data-refresh=\"steps\"><thead><tr><th>seq</th>\
         <th>kind</th><th>name</th><th>start</th><th>duration</th><th>attempts</th>\
         <th>outcome</th><th>value</th><th class=\"bar\">timeline</th></tr></thead><tbody>",
    );
    for step in steps {
        let began = began(step);
        let offset = since(start, began);
        let took = since(began, step.finished_at);
        let x = (offset.as_secs_f64() / span * 1000.0).clamp(0.0, 1000.0);
        let width = (took.as_secs_f64() / span * 1000.0).clamp(4.0, 1000.0 - x.min(996.0));
        let outcome = match step.outcome {
            StepOutcome::Ok => "ok",
            StepOutcome::Err => "err",
        };
        out.push_str(&format!(
            "<tr data-seq=\"{seq}\" class=\"{outcome}\"><td>{seq}</td><td>{kind}</td><td>{name}</td>\
             <td>+{offset}</td><td>{took}</td><td>{attempts}</td>\
             <td><span class=\"outcome {outcome}\">{outcome}</span></td><td>{value}</td>\
             <td class=\"bar\"><svg viewBox=\"0 0 1000 10\" preserveAspectRatio=\"none\" \
             aria-hidden=\"true\"><rect class=\"{outcome}\" x=\"{x:.1}\" y=\"0\" width=\"{width:.1}\" \
             height=\"10\"/></svg></td></tr>",
            seq = step.seq,
            kind = escape(&step.kind),
            name = escape(&step.name),
            offset = html::duration(offset),
            took = if step.started_at.is_some() {
                html::duration(took)
            } else {
                "–".to_owned()
            },
            attempts = step
                .attempts
                .map(|a| a.to_string())
                .unwrap_or_else(|| "–".to_owned()),
            value = html::json_block(&step.value),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// What the instance waits for from outside: its unanswered awakeables,
/// each with forms to resolve or reject it, and the messages sent to it
/// that it has not received yet.
fn waiting(request: &Request, detail: &Detail) -> String {
    let disabled = disabled(request);
    let mut out = String::from("<div id=\"waiting\" data-refresh=\"waiting\">");
    if !detail.awakeables.is_empty() {
        out.push_str(
            "<h2>Awakeables waiting for an answer</h2><table id=\"awakeables\"><thead><tr>\
             <th>awakeable id</th><th>seq</th><th>type</th><th>created</th><th>answer</th>\
             </tr></thead><tbody>",
        );
        for awakeable in &detail.awakeables {
            let id = escape(&awakeable.id);
            out.push_str(&format!(
                "<tr data-seq=\"{seq}\"><td><code>{id}</code></td><td>{seq}</td><td>{kind}</td>\
                 <td>{created}</td><td>\
                 <form class=\"op\" data-op=\"awakeables/{{awakeable}}/resolve\" data-shape=\"resolve\">\
                 <input type=\"hidden\" name=\"awakeable\" value=\"{id}\">\
                 <label>value (JSON) <input name=\"value\" value=\"null\" required></label>\
                 <button type=\"submit\" class=\"op-resolve\"{disabled}>Resolve</button></form>\
                 <form class=\"op\" data-op=\"awakeables/{{awakeable}}/reject\" data-shape=\"reject\">\
                 <input type=\"hidden\" name=\"awakeable\" value=\"{id}\">\
                 <label>reason <input name=\"reason\" required></label>\
                 <button type=\"submit\" class=\"op-reject\"{disabled}>Reject</button></form>\
                 </td></tr>",
                seq = awakeable.seq,
                kind = escape(awakeable.awaited_type.as_deref().unwrap_or("")),
                created = html::time(awakeable.created_at),
            ));
        }
        out.push_str("</tbody></table>");
    }
    if !detail.messages.is_empty() {
        out.push_str(
            "<h2>Messages not yet received</h2><table id=\"messages\"><thead><tr>\
             <th>topic</th><th>value</th><th>sent</th></tr></thead><tbody>",
        );
        for waiting in &detail.messages {
            out.push_str(&format!(
                "<tr><td>{topic}</td><td>{value}</td><td>{sent}</td></tr>",
                topic = escape(&waiting.topic),
                value = html::json_block(&json::stored(&waiting.message.payload)),
                sent = html::time(crate::time::from_us(waiting.message.sent_at)),
            ));
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</div>");
    out
}
