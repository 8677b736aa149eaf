//! `/api/instances`: listing, one instance's detail, and the operations
//! that change an instance's course (cancel, retry, resume, fork, send).

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::detail::Detail;
use super::extract::{Body, Id, Params};
use super::ApiResult;
use crate::admin::auth::Operator;
use crate::admin::error::ApiError;
use crate::admin::json::{self, STATUSES};
use crate::admin::Shared;
use crate::{CancelOutcome, ForkFrom, Keiro, ListFilter};

/// The query of `GET /api/instances`: [`ListFilter`]'s fields, `status` a
/// comma-separated list of [`STATUSES`].
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    status: Option<String>,
    name: Option<String>,
    id_prefix: Option<String>,
    parent_id: Option<String>,
    version: Option<String>,
    queue: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
    #[serde(default)]
    oldest_first: bool,
}

impl ListQuery {
    /// The filter it asks for; an unknown status is refused naming it and
    /// the valid ones.
    pub(crate) fn filter(&self) -> Result<ListFilter, ApiError> {
        let mut filter = ListFilter::default();
        let statuses = self.status.as_deref().unwrap_or_default();
        for name in statuses.split(',').filter(|name| !name.trim().is_empty()) {
            let status = json::parse_status(name).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_status",
                    format!(
                        "unknown status `{}` in ?status=; valid statuses: {}",
                        name.trim(),
                        STATUSES.join(", ")
                    ),
                )
            })?;
            filter = filter.status(status);
        }
        let optional = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
        if let Some(name) = optional(&self.name) {
            filter = filter.name(name);
        }
        if let Some(prefix) = optional(&self.id_prefix) {
            filter = filter.id_prefix(prefix);
        }
        if let Some(parent) = optional(&self.parent_id) {
            filter = filter.parent_id(parent);
        }
        if let Some(version) = optional(&self.version) {
            filter = filter.version(version);
        }
        if let Some(queue) = optional(&self.queue) {
            filter = filter.queue(queue);
        }
        if let Some(limit) = self.limit {
            filter = filter.limit(limit);
        }
        if let Some(cursor) = optional(&self.cursor) {
            filter = filter.cursor(cursor);
        }
        if self.oldest_first {
            filter = filter.oldest_first();
        }
        Ok(filter)
    }
}

/// `GET /api/instances`: one page of summaries.
pub(crate) async fn list(
    State(state): State<Shared>,
    Params(query): Params<ListQuery>,
) -> ApiResult {
    let page = state.keiro.list(&query.filter()?).await?;
    Ok(Json(json!({
        "instances": page.items.iter().map(json::summary).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
    })))
}

/// `GET /api/instances/{id}`: the instance, its journal, children, pending
/// awakeables and waiting messages.
pub(crate) async fn show(State(state): State<Shared>, Id(id): Id) -> ApiResult {
    Ok(Json(Detail::load(&state.keiro, &id).await?.to_json()))
}

/// `{"outcome": outcome, "instance": summary of id}`.
async fn changed(keiro: &Keiro, outcome: &str, id: &str) -> ApiResult {
    let summary = keiro.summary(id).await?;
    Ok(Json(
        json!({ "outcome": outcome, "instance": json::summary(&summary) }),
    ))
}

/// `POST /api/instances/{id}/cancel`: cancels it and its unfinished
/// descendants; an instance that has ended already is refused (409).
pub(crate) async fn cancel(_: Operator, State(state): State<Shared>, Id(id): Id) -> ApiResult {
    match state.keiro.cancel(&id).await? {
        CancelOutcome::Cancelled { ids } => {
            let summary = state.keiro.summary(&id).await?;
            Ok(Json(json!({
                "outcome": "cancelled",
                "cancelled": ids,
                "instance": json::summary(&summary),
            })))
        }
        CancelOutcome::AlreadyFinished(status) => Err(ApiError::conflict(
            "already_finished",
            format!(
                "workflow instance `{id}` has already ended ({}); nothing was cancelled",
                json::status_name(&status)
            ),
        )),
    }
}

/// `POST /api/instances/{id}/retry` ([`Keiro::retry`]).
pub(crate) async fn retry(_: Operator, State(state): State<Shared>, Id(id): Id) -> ApiResult {
    state.keiro.retry(&id).await?;
    changed(&state.keiro, "retried", &id).await
}

/// `POST /api/instances/{id}/resume` ([`Keiro::resume`]).
pub(crate) async fn resume(_: Operator, State(state): State<Shared>, Id(id): Id) -> ApiResult {
    state.keiro.resume(&id).await?;
    changed(&state.keiro, "resumed", &id).await
}

/// The body of `POST /api/instances/{id}/fork`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    from_step: i64,
    new_id: Option<String>,
}

/// `POST /api/instances/{id}/fork` ([`Keiro::fork`]): `{"id": new id,
/// "instance": its summary}`.
pub(crate) async fn fork(
    _: Operator,
    State(state): State<Shared>,
    Id(id): Id,
    Body(body): Body<ForkBody>,
) -> ApiResult {
    if body.from_step < 0 {
        return Err(ApiError::bad_request(
            "invalid_from_step",
            format!(
                "from_step {} is not a journal position; give the seq of a step of instance \
                 `{id}` (0 or more)",
                body.from_step
            ),
        ));
    }
    let from = ForkFrom::Step(body.from_step);
    let new_id = match body.new_id.filter(|new_id| !new_id.is_empty()) {
        Some(new_id) => state.keiro.fork(&id, from).id(new_id).await?,
        None => state.keiro.fork(&id, from).await?,
    };
    let summary = state.keiro.summary(&new_id).await?;
    Ok(Json(
        json!({ "id": new_id, "instance": json::summary(&summary) }),
    ))
}

/// The body of `POST /api/instances/{id}/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessageBody {
    topic: String,
    #[serde(default)]
    value: Value,
    idempotency_key: Option<String>,
}

/// `POST /api/instances/{id}/messages` ([`Keiro::send`]).
pub(crate) async fn send(
    _: Operator,
    State(state): State<Shared>,
    Id(id): Id,
    Body(body): Body<MessageBody>,
) -> ApiResult {
    let mut sending = state.keiro.send(id.as_str(), body.topic, &body.value);
    if let Some(key) = body.idempotency_key {
        sending = sending.idempotency_key(key);
    }
    sending.await?;
    changed(&state.keiro, "sent", &id).await
}
