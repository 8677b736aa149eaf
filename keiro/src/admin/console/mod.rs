//! The web console: server-rendered HTML pages over the inspection API,
//! with a little plain JavaScript for live refresh and the operation
//! buttons (which call the JSON API). Its stylesheet and script are
//! compiled into the binary.

mod html;
mod instance;
mod list;
mod timers;

use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;
use super::Shared;
use html::{escape, Frame, Section};

/// The console's stylesheet.
const CSS: &str = include_str!("../assets/console.css");
/// The console's script: live refresh and the operation buttons.
const JS: &str = include_str!("../assets/console.js");

/// The console's routes.
pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(list::page))
        .route("/instances/{id}", get(instance::page))
        .route("/timers", get(timers::page))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
}

/// Where a request's router is mounted, from the path the client asked for
/// and the path the router saw: `/keiro` for `/keiro/timers` seen as
/// `/timers`, `""` at the root. Every link the pages write starts with it.
fn base_path(original: &Uri, seen: &Uri) -> String {
    let asked = original.path();
    let base = asked.strip_suffix(seen.path()).unwrap_or(asked);
    base.trim_end_matches('/').to_owned()
}

/// The request facts every page needs to draw its frame.
struct Request {
    base: String,
    writable: bool,
    backend: &'static str,
}

impl Request {
    fn new(state: &Shared, original: &Uri, seen: &Uri) -> Request {
        Request {
            base: base_path(original, seen),
            writable: state.token.is_some(),
            backend: state.keiro.store().backend(),
        }
    }

    fn frame(&self) -> Frame<'_> {
        Frame {
            base: &self.base,
            writable: self.writable,
            backend: self.backend,
        }
    }
}

/// An HTML page with the headers that keep stored values inert even if one
/// slipped through unescaped: scripts and styles only from the console's
/// own assets, no framing, no sniffing.
fn html_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A page saying what went wrong, with the error's own text.
fn error_page(request: &Request, section: Section, status: StatusCode, message: &str) -> Response {
    let body = format!("<p class=\"error\">{}</p>", escape(message));
    let title = status.canonical_reason().unwrap_or("Error");
    html_response(status, html::page(&request.frame(), section, title, &body))
}

/// A page for `error`, with the status and sentence the JSON API answers
/// it with (one classification for both).
fn failure_page(request: &Request, section: Section, error: impl Into<ApiError>) -> Response {
    let error = error.into();
    error_page(request, section, error.status, &error.message)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(original: &str, seen: &str) -> String {
        base_path(&original.parse().unwrap(), &seen.parse().unwrap())
    }

    #[test]
    fn base_path_is_the_mount_point() {
        assert_eq!(base("/", "/"), "");
        assert_eq!(base("/timers", "/timers"), "");
        assert_eq!(base("/keiro", "/"), "/keiro");
        assert_eq!(base("/keiro/", "/"), "/keiro");
        assert_eq!(base("/ops/keiro/instances/a", "/instances/a"), "/ops/keiro");
    }
}
