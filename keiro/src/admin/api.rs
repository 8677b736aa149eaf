//! The JSON endpoints under `/api`.

use axum::Router;

use super::Shared;

/// The `/api` routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
}
