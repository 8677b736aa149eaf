//! `/api/awakeables/{id}`: answering an awakeable from outside.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::extract::{Body, Id};
use super::ApiResult;
use crate::admin::auth::Operator;
use crate::admin::Shared;

/// `POST /api/awakeables/{id}/resolve`: the body is the answer
/// ([`crate::Keiro::resolve_awakeable_json`]).
pub(crate) async fn resolve(
    _: Operator,
    State(state): State<Shared>,
    Id(id): Id,
    Body(value): Body<Value>,
) -> ApiResult {
    state.keiro.resolve_awakeable_json(&id, value).await?;
    Ok(Json(json!({ "outcome": "resolved", "awakeable_id": id })))
}

/// The body of `POST /api/awakeables/{id}/reject`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RejectBody {
    reason: String,
}

/// `POST /api/awakeables/{id}/reject` ([`crate::Keiro::reject_awakeable`]).
pub(crate) async fn reject(
    _: Operator,
    State(state): State<Shared>,
    Id(id): Id,
    Body(body): Body<RejectBody>,
) -> ApiResult {
    state.keiro.reject_awakeable(&id, body.reason).await?;
    Ok(Json(json!({ "outcome": "rejected", "awakeable_id": id })))
}
