//! The timers page: pending, stuck and dead-lettered process-manager
//! timers, with requeue for stuck ones and resume for dead ones.

use std::time::Duration;

use axum::extract::{OriginalUri, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use serde::Deserialize;

use super::html::{self, escape, url_component, Section};
use super::{error_page, failure_page, html_response, Request};
use crate::admin::Shared;
use crate::timers::{TimerPageRequest, TimerRow};

/// Rows per page.
const PAGE_ROWS: u32 = 50;

/// A firing timer counts as stuck after this long.
const STUCK_AFTER: Duration = Duration::from_secs(60);

/// The timers page's query string.
#[derive(Debug, Default, Deserialize)]
pub(super) struct TimersQuery {
    view: Option<String>,
    cursor: Option<String>,
}

/// Which listing the page shows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Pending,
    Stuck,
    Dead,
}

impl View {
    const ALL: [View; 3] = [View::Pending, View::Stuck, View::Dead];

    fn name(self) -> &'static str {
        match self {
            View::Pending => "pending",
            View::Stuck => "stuck",
            View::Dead => "dead",
        }
    }

    fn parse(name: &str) -> Option<View> {
        View::ALL.into_iter().find(|view| view.name() == name)
    }
}

/// `GET /timers`.
pub(super) async fn page(
    State(state): State<Shared>,
    OriginalUri(original): OriginalUri,
    seen: Uri,
    Query(query): Query<TimersQuery>,
) -> Response {
    let request = Request::new(&state, &original, &seen);
    let asked = query.view.as_deref().map(str::trim).unwrap_or("dead");
    let Some(view) = View::parse(asked) else {
        let message = format!("unknown timer list `{asked}`; the lists are pending, stuck, dead");
        return error_page(&request, Section::Timers, StatusCode::BAD_REQUEST, &message);
    };
    let mut page_request = TimerPageRequest::first(PAGE_ROWS);
    if let Some(cursor) = query.cursor.as_deref().filter(|c| !c.is_empty()) {
        page_request = page_request.after(cursor);
    }
    let timers = state.keiro.timers();
    let listed = match view {
        View::Pending => timers.pending(&page_request).await,
        View::Stuck => timers.stuck(STUCK_AFTER, &page_request).await,
        View::Dead => timers.dead(&page_request).await,
    };
    let listed = match listed {
        Ok(listed) => listed,
        Err(error) => return failure_page(&request, Section::Timers, error),
    };
    let base = escape(&request.base);
    let mut body = String::from("<nav class=\"statuses\" id=\"timer-views\">");
    for each in View::ALL {
        let current = if each == view {
            " class=\"current\""
        } else {
            ""
        };
        body.push_str(&format!(
            "<a href=\"{base}/timers?view={name}\"{current}>{label}</a>",
            name = each.name(),
            label = if each == View::Dead {
                "dead letters"
            } else {
                each.name()
            },
        ));
    }
    body.push_str("</nav>");
    if view == View::Stuck {
        body.push_str(&format!(
            "<p>Timers a worker claimed more than {} ago and has not finished.</p>",
            html::duration(STUCK_AFTER)
        ));
    }
    body.push_str(&table(&request, view, &listed.items));
    if let Some(next) = &listed.next_cursor {
        body.push_str(&format!(
            "<nav class=\"pager\"><a id=\"next-page\" href=\"{base}/timers?view={}&amp;cursor={}\">\
             next page »</a></nav>",
            view.name(),
            escape(&url_component(next))
        ));
    }
    let title = format!("Timers: {}", view.name());
    html_response(
        StatusCode::OK,
        html::page(&request.frame(), Section::Timers, &title, &body),
    )
}

/// The timers as a table, with the operation the view allows.
fn table(request: &Request, view: View, items: &[TimerRow]) -> String {
    if items.is_empty() {
        return format!("<p class=\"empty\">No {} timers.</p>", view.name());
    }
    let disabled = if request.writable { "" } else { " disabled" };
    let live = if view == View::Dead { "" } else { " data-live" };
    let mut out = format!(
        "<table class=\"timers\" id=\"timers\" data-refresh=\"timers\"{live}><thead><tr>\
         <th>id</th><th>process manager</th><th>correlation</th><th>fires at</th>\
         <th>attempts</th><th>last error</th><th>payload</th><th></th></tr></thead><tbody>"
    );
    for timer in items {
        let id = timer.id.as_str();
        let action = match view {
            View::Pending => String::new(),
            View::Stuck => op_button(id, "requeue", "Requeue", disabled),
            View::Dead => op_button(id, "resume", "Resume", disabled),
        };
        out.push_str(&format!(
            "<tr data-id=\"{id_text}\"><td><code>{id_text}</code></td><td>{pm}</td>\
             <td>{correlation}</td><td>{fire_at}</td><td>{attempts}</td><td>{error}</td>\
             <td>{payload}</td><td>{action}</td></tr>",
            id_text = escape(id),
            pm = escape(&timer.process_manager),
            correlation = escape(&timer.correlation_id),
            fire_at = html::time(timer.fire_at),
            attempts = timer.attempts,
            error = escape(timer.last_error.as_deref().unwrap_or("")),
            payload = html::json_block(&timer.payload),
        ));
    }
    out.push_str("</tbody></table>");
    out
}

fn op_button(id: &str, op: &str, label: &str, disabled: &str) -> String {
    format!(
        "<form class=\"op\" data-op=\"timers/{}/{op}\" data-shape=\"none\">\
         <button type=\"submit\"{disabled}>{label}</button></form>",
        url_component(id)
    )
}
