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
