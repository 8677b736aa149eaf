//! The admin HTTP API and web console, as an [`axum::Router`] an application
//! mounts under any path (cargo feature `admin`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let keiro = keiro::Keiro::connect("sqlite:keiro.db").await?;
//! let app = axum::Router::new().nest("/keiro", keiro::admin::router(keiro));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7878").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! * `GET /api/...` reads (instances, steps, timers) need no token.
//! * Every request that changes state (`POST /api/...`) needs
//!   `Authorization: Bearer TOKEN`, where the token is
//!   [`Admin::token`]'s, else the [`ADMIN_TOKEN_ENV`] variable's. With no
//!   token configured the router is read-only: those requests get `403`, and
//!   the console says so.
//! * `/` is the web console: server-rendered HTML with a little plain
//!   JavaScript, compiled into the binary.
//!
//! The JSON API (shapes: [`json`]). Ids that hold a `/` (a child's
//! `parent/3`, every awakeable id) are percent-encoded in the path
//! (`parent%2F3`). A refusal is `{"error": TEXT, "kind": KIND}`, the text
//! being the [`crate::Error`]'s sentence, with `400` for bad input, `401`
//! without a token, `403` with a wrong one or on a read-only router, `404`
//! for an unknown id, `409` for a transition the state refuses, `413` for
//! a payload over the limit and `5xx` for store failures. An unknown path
//! under `/api` is a JSON `404` (`no_route`), a wrong method a JSON `405`.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/health` | `{"backend", "read_only"}` |
//! | `GET /api/instances?status=&name=&id_prefix=&parent_id=&limit=&cursor=&oldest_first=` | `{"instances": [summary], "next_cursor"}` |
//! | `GET /api/instances/{id}` | `{"instance", "input", "output", "steps", "children", "children_next_cursor", "awakeables", "messages"}` |
//! | `POST /api/instances/{id}/cancel` | `{"outcome": "cancelled", "cancelled": [ids], "instance"}` |
//! | `POST /api/instances/{id}/retry`, `/resume` | `{"outcome", "instance"}` |
//! | `POST /api/instances/{id}/fork` `{"from_step", "new_id"?}` | `{"id", "instance"}` |
//! | `POST /api/instances/{id}/messages` `{"topic", "value", "idempotency_key"?}` | `{"outcome": "sent", "instance"}` |
//! | `POST /api/awakeables/{id}/resolve` (body: the value) | `{"outcome": "resolved", "awakeable_id"}` |
//! | `POST /api/awakeables/{id}/reject` `{"reason"}` | `{"outcome": "rejected", "awakeable_id"}` |
//! | `GET /api/timers?view=pending\|stuck\|dead&older_than_secs=&process_manager=&limit=&cursor=` | `{"timers": [timer], "next_cursor"}` |
//! | `POST /api/timers/{id}/requeue`, `/resume` | `{"outcome", "timer"}` |
//!
//! `status` takes a comma-separated list (`status=failed,suspended`); the
//! detail's `children` are the first 100 (`children_next_cursor` continues
//! them in `GET /api/instances?parent_id=`), `awakeables` the unanswered
//! ones of an unfinished instance, `messages` the first 100 not yet
//! received; a timers page also says its `view`.

mod api;
mod auth;
mod console;
mod error;
pub mod json;

use std::sync::Arc;

use crate::Keiro;

/// The environment variable [`router`] reads the admin token from.
pub const ADMIN_TOKEN_ENV: &str = "KEIRO_ADMIN_TOKEN";

/// The admin router's settings: which runtime it operates, and the token
/// that allows changes.
#[derive(Clone)]
pub struct Admin {
    keiro: Keiro,
    token: Option<String>,
}

impl Admin {
    /// Settings for operating `keiro`, with the token from
    /// [`ADMIN_TOKEN_ENV`] when that is set and not blank.
    pub fn new(keiro: Keiro) -> Admin {
        let token = std::env::var(ADMIN_TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty());
        Admin { keiro, token }
    }

    /// The bearer token state-changing requests must carry; `None` makes
    /// the router read-only. Overrides [`ADMIN_TOKEN_ENV`].
    pub fn token(mut self, token: Option<String>) -> Admin {
        self.token = token.filter(|t| !t.trim().is_empty());
        self
    }

    /// Whether a token is configured, i.e. whether operations are allowed.
    pub fn allows_changes(&self) -> bool {
        self.token.is_some()
    }

    /// The router: the JSON API under `/api` and the console at `/`.
    pub fn router(self) -> axum::Router {
        let state = Arc::new(AdminState {
            keiro: self.keiro,
            token: self.token,
        });
        axum::Router::new()
            .merge(api::routes())
            .merge(console::routes())
            .with_state(state)
    }
}

/// The admin router for `keiro`, with the token from [`ADMIN_TOKEN_ENV`]
/// (read-only without one). [`Admin`] sets the token in code.
pub fn router(keiro: Keiro) -> axum::Router {
    Admin::new(keiro).router()
}

/// What every handler shares.
pub(crate) struct AdminState {
    pub(crate) keiro: Keiro,
    pub(crate) token: Option<String>,
}

/// The handlers' shared state, as axum hands it over.
pub(crate) type Shared = Arc<AdminState>;
