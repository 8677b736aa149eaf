//! The web console's HTML pages.

use axum::Router;

use super::Shared;

/// The console's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
}
