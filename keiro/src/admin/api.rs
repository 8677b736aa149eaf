//! The JSON endpoints under `/api`, as [`super`]'s module docs list them.
//! Reads need no token; every `POST` goes through
//! [`super::auth::Operator`].
//!
//! Errors are `{"error", "kind"}` ([`super::error`]).

mod awakeables;
pub(crate) mod detail;
mod extract;
mod instances;
mod timers;

use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::Shared;

/// The `/api` routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/health", get(health))
        .route("/api/instances", get(instances::list))
        .route("/api/instances/{id}", get(instances::show))
        .route("/api/instances/{id}/cancel", post(instances::cancel))
        .route("/api/instances/{id}/retry", post(instances::retry))
        .route("/api/instances/{id}/resume", post(instances::resume))
        .route("/api/instances/{id}/fork", post(instances::fork))
        .route("/api/instances/{id}/messages", post(instances::send))
        .route("/api/awakeables/{id}/resolve", post(awakeables::resolve))
        .route("/api/awakeables/{id}/reject", post(awakeables::reject))
        .route("/api/timers", get(timers::list))
        .route("/api/timers/{id}/requeue", post(timers::requeue))
        .route("/api/timers/{id}/resume", post(timers::resume))
        .route("/api", any(unknown_route))
        .route("/api/{*rest}", any(unknown_route))
        .method_not_allowed_fallback(wrong_method)
}

/// A known path with a method it does not take: a JSON 405.
async fn wrong_method(method: Method, uri: Uri) -> super::error::ApiError {
    super::error::ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("`{}` does not take {method}", uri.path()),
    )
}

/// Any other path or method under `/api`: a JSON 404 naming what was asked,
/// instead of an empty body.
async fn unknown_route(method: Method, uri: Uri) -> super::error::ApiError {
    super::error::ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!(
            "the admin API has no route `{method} {}` (see keiro::admin's docs for the routes)",
            uri.path()
        ),
    )
}

/// `GET /api/health`: which backend, and whether operations are refused.
async fn health(State(state): State<Shared>) -> Json<Value> {
    Json(json!({
        "backend": state.keiro.store().backend(),
        "read_only": state.token.is_none(),
    }))
}

/// What every handler answers: a JSON document or the JSON error.
type ApiResult = Result<Json<Value>, super::error::ApiError>;
