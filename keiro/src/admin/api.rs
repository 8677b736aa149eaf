//! The JSON endpoints under `/api` (reference: [`super`]'s module docs and
//! the README). Reads need no token; every `POST` goes through
//! [`super::auth::Operator`]. Ids that hold a `/` (a child's `parent/3`, every
//! awakeable id) are percent-encoded in the path (`parent%2F3`).
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/health` | `{"backend", "read_only"}` |
//! | `GET /api/instances?status=&name=&id_prefix=&parent_id=&limit=&cursor=&oldest_first=` | `{"instances": [summary], "next_cursor"}` |
//! | `GET /api/instances/{id}` | `{"instance", "input", "output", "steps", "children", "awakeables", "messages"}` |
//! | `POST /api/instances/{id}/cancel` | `{"outcome": "cancelled", "cancelled": [ids], "instance"}` |
//! | `POST /api/instances/{id}/retry`, `/resume` | `{"outcome", "instance"}` |
//! | `POST /api/instances/{id}/fork` `{"from_step", "new_id"?}` | `{"id", "instance"}` |
//! | `POST /api/instances/{id}/messages` `{"topic", "value", "idempotency_key"?}` | `{"outcome": "sent", "instance"}` |
//! | `POST /api/awakeables/{id}/resolve` (body: the value) | `{"outcome": "resolved", "awakeable_id"}` |
//! | `POST /api/awakeables/{id}/reject` `{"reason"}` | `{"outcome": "rejected", "awakeable_id"}` |
//! | `GET /api/timers?view=pending\|stuck\|dead&older_than_secs=&process_manager=&limit=&cursor=` | `{"timers": [timer], "next_cursor"}` |
//! | `POST /api/timers/{id}/requeue`, `/resume` | `{"outcome", "timer"}` |
//!
//! Errors are `{"error", "kind"}` ([`super::error`]).

mod awakeables;
pub(crate) mod detail;
mod extract;
mod instances;
mod timers;

use axum::extract::State;
use axum::routing::{get, post};
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
