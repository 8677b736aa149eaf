//! `/api/timers`: the pending, stuck and dead pages, and moving one timer.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::extract::{Id, Params};
use super::ApiResult;
use crate::admin::auth::Operator;
use crate::admin::error::ApiError;
use crate::admin::json;
use crate::admin::Shared;
use crate::timers::{TimerAction, TimerFilter, TimerId, TimerPageRequest};

/// How long a claim must have lasted for `view=stuck` when
/// `older_than_secs` is not given.
const STUCK_AFTER: Duration = Duration::from_secs(60);

/// The query of `GET /api/timers`.
#[derive(Debug, Deserialize)]
pub(crate) struct TimersQuery {
    view: Option<String>,
    older_than_secs: Option<u64>,
    process_manager: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// `GET /api/timers?view=pending|stuck|dead`: one page.
pub(crate) async fn list(
    State(state): State<Shared>,
    Params(query): Params<TimersQuery>,
) -> ApiResult {
    let mut request = TimerPageRequest::first(query.limit.unwrap_or(50)).filter(TimerFilter {
        process_manager: query.process_manager.filter(|pm| !pm.is_empty()),
        reason: None,
    });
    if let Some(cursor) = query.cursor.filter(|cursor| !cursor.is_empty()) {
        request = request.after(cursor);
    }
    let timers = state.keiro.timers();
    let view = query.view.as_deref().unwrap_or("pending");
    let page = match view {
        "pending" => timers.pending(&request).await?,
        "stuck" => {
            let older_than = query
                .older_than_secs
                .map_or(STUCK_AFTER, Duration::from_secs);
            timers.stuck(older_than, &request).await?
        }
        "dead" => timers.dead(&request).await?,
        other => {
            return Err(ApiError::bad_request(
                "invalid_view",
                format!(
                    "unknown timer view `{other}` in ?view=; valid views: pending, stuck, dead"
                ),
            ))
        }
    };
    Ok(Json(json!({
        "view": view,
        "timers": page.items.iter().map(json::timer).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })))
}

/// `POST /api/timers/{id}/requeue`: a firing or dead timer back in line
/// ([`crate::timers::Timers::requeue`]).
pub(crate) async fn requeue(_: Operator, State(state): State<Shared>, Id(id): Id) -> ApiResult {
    let id = TimerId::new(id);
    let change = state.keiro.timers().requeue(&id).await?;
    let timer = change.applied(&id, TimerAction::Requeue)?;
    Ok(Json(
        json!({ "outcome": "requeued", "timer": json::timer(&timer) }),
    ))
}

/// `POST /api/timers/{id}/resume`: a dead timer back in line with zero
/// attempts ([`crate::timers::Timers::requeue_dead`]).
pub(crate) async fn resume(_: Operator, State(state): State<Shared>, Id(id): Id) -> ApiResult {
    let timer = state.keiro.timers().requeue_dead(&TimerId::new(id)).await?;
    Ok(Json(
        json!({ "outcome": "resumed", "timer": json::timer(&timer) }),
    ))
}
