//! The instance list: status filter, id-prefix and name search, paging.

use axum::extract::{OriginalUri, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use serde::Deserialize;

use super::html::{self, escape, url_component, Section};
use super::{error_page, failure_page, html_response, Request};
use crate::admin::json::{parse_status, status_name, STATUSES};
use crate::admin::Shared;
use crate::{ListFilter, WorkflowStatus, WorkflowSummary};

/// Rows per page.
const PAGE_ROWS: u32 = 50;

/// The list page's query string.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    status: Option<String>,
    q: Option<String>,
    name: Option<String>,
    cursor: Option<String>,
}

impl ListQuery {
    fn given(value: &Option<String>) -> Option<&str> {
        value.as_deref().map(str::trim).filter(|v| !v.is_empty())
    }

    /// This query's URL with `cursor` in place of its own.
    fn href(&self, base: &str, status: Option<&str>, cursor: Option<&str>) -> String {
        let mut parts = Vec::new();
        if let Some(status) = status {
            parts.push(format!("status={}", url_component(status)));
        }
        if let Some(q) = Self::given(&self.q) {
            parts.push(format!("q={}", url_component(q)));
        }
        if let Some(name) = Self::given(&self.name) {
            parts.push(format!("name={}", url_component(name)));
        }
        if let Some(cursor) = cursor {
            parts.push(format!("cursor={}", url_component(cursor)));
        }
        if parts.is_empty() {
            html::home(base)
        } else {
            format!("{}?{}", html::home(base), parts.join("&"))
        }
    }
}

/// `GET /`: the instance list.
pub(super) async fn page(
    State(state): State<Shared>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    Query(query): Query<ListQuery>,
) -> Response {
    let request = Request::new(&state, &original, &seen);
    let status = ListQuery::given(&query.status);
    let mut filter = ListFilter::default().limit(PAGE_ROWS);
    if let Some(name) = status {
        match parse_status(name) {
            Some(parsed) => filter = filter.status(parsed),
            None => {
                let message = format!(
                    "unknown status `{name}`; the statuses are {}",
                    STATUSES.join(", ")
                );
                return error_page(
                    &request,
                    Section::Instances,
                    StatusCode::BAD_REQUEST,
                    &message,
                );
            }
        }
    }
    if let Some(prefix) = ListQuery::given(&query.q) {
        filter = filter.id_prefix(prefix);
    }
    if let Some(name) = ListQuery::given(&query.name) {
        filter = filter.name(name);
    }
    if let Some(cursor) = ListQuery::given(&query.cursor) {
        filter = filter.cursor(cursor);
    }
    let listed = match state.keiro.list(&filter).await {
        Ok(page) => page,
        Err(error) => return failure_page(&request, Section::Instances, error),
    };
    let base = &request.base;
    let mut body = String::new();
    body.push_str(&filters(&query, base, status));
    body.push_str(&table(base, &listed.items));
    body.push_str("<nav class=\"pager\">");
    if query.cursor.is_some() {
        body.push_str(&format!(
            "<a id=\"first-page\" href=\"{}\">« first page</a>",
            escape(&query.href(base, status, None))
        ));
    }
    if let Some(next) = &listed.next_cursor {
        body.push_str(&format!(
            "<a id=\"next-page\" href=\"{}\">next page »</a>",
            escape(&query.href(base, status, Some(next)))
        ));
    }
    body.push_str("</nav>");
    let title = match status {
        Some(status) => format!("Instances: {status}"),
        None => "Instances".to_owned(),
    };
    html_response(
        StatusCode::OK,
        html::page(&request.frame(), Section::Instances, &title, &body),
    )
}

/// The status tabs and the search form.
fn filters(query: &ListQuery, base: &str, status: Option<&str>) -> String {
    let mut out = String::from("<nav class=\"statuses\" id=\"status-filter\">");
    let all = if status.is_none() {
        " class=\"current\""
    } else {
        ""
    };
    out.push_str(&format!(
        "<a href=\"{}\" data-status=\"all\"{all}>all</a>",
        escape(&query.href(base, None, None))
    ));
    for name in STATUSES {
        let current = if status == Some(name) {
            " class=\"current\""
        } else {
            ""
        };
        out.push_str(&format!(
            "<a href=\"{}\" data-status=\"{name}\"{current}>{}</a>",
            escape(&query.href(base, Some(name), None)),
            name.replace('_', " ")
        ));
    }
    out.push_str("</nav>");
    out.push_str(&format!(
        "<form class=\"search\" method=\"get\" action=\"{home}\">\
         {status_field}\
         <input name=\"q\" id=\"id-prefix\" placeholder=\"id starts with…\" value=\"{q}\">\
         <input name=\"name\" placeholder=\"workflow name\" value=\"{name}\">\
         <button type=\"submit\">Search</button></form>",
        home = escape(&html::home(base)),
        status_field = status
            .map(|s| format!(
                "<input type=\"hidden\" name=\"status\" value=\"{}\">",
                escape(s)
            ))
            .unwrap_or_default(),
        q = escape(ListQuery::given(&query.q).unwrap_or("")),
        name = escape(ListQuery::given(&query.name).unwrap_or("")),
    ));
    out
}

/// Whether an instance may still change by itself (so the page refreshes).
pub(super) fn is_live(status: &WorkflowStatus) -> bool {
    matches!(
        status,
        WorkflowStatus::Pending | WorkflowStatus::Running | WorkflowStatus::Suspended
    )
}

/// The instances as a table, each id a link to its page.
pub(super) fn table(base: &str, items: &[WorkflowSummary]) -> String {
    if items.is_empty() {
        return "<p class=\"empty\" data-refresh=\"instances\">No instances match.</p>".to_owned();
    }
    let live = if items.iter().any(|s| is_live(&s.status)) {
        " data-live"
    } else {
        ""
    };
    let mut out = format!(
        "<table class=\"instances\" id=\"instances\" data-refresh=\"instances\"{live}>\
         <thead><tr><th>id</th><th>workflow</th><th>status</th><th>created</th>\
         <th>updated</th><th>attempts</th><th>detail</th></tr></thead><tbody>"
    );
    for s in items {
        let status = status_name(&s.status);
        out.push_str(&format!(
            "<tr data-id=\"{id}\" data-status=\"{status}\">\
             <td><a class=\"id\" href=\"{base}/instances/{link}\">{id}</a></td>\
             <td>{name}</td><td><span class=\"status {status}\">{status_text}</span></td>\
             <td>{created}</td><td>{updated}</td><td>{attempts}</td><td class=\"detail\">{detail}</td></tr>",
            id = escape(&s.id),
            base = escape(base),
            link = escape(&url_component(&s.id)),
            name = escape(&s.name),
            status_text = status.replace('_', " "),
            created = html::time(s.created_at),
            updated = html::time(s.updated_at),
            attempts = s.attempts,
            detail = escape(&detail(s)),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

/// The one thing most worth saying about an instance in a row.
fn detail(s: &WorkflowSummary) -> String {
    if let WorkflowStatus::NonDeterministic { expected, found } = &s.status {
        return format!("journal has {expected}, code calls {found}");
    }
    if let Some(error) = &s.error {
        return html::cut(error, 120);
    }
    if s.status == WorkflowStatus::Failed {
        // No diagnostic: the workflow returned its `Err`, which is its
        // output, shown on its page.
        return "returned Err (its output is on its page)".to_owned();
    }
    if let Some(waiting) = &s.waiting_on {
        return format!(
            "waits on {} `{}` (seq {})",
            waiting.kind, waiting.name, waiting.seq
        );
    }
    if let Some(executor) = &s.executor {
        return format!("held by {executor}");
    }
    String::new()
}
