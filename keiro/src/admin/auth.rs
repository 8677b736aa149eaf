//! The bearer-token check of every request that changes state.
//!
//! Reads need no token. A change needs `Authorization: Bearer TOKEN` with
//! the router's token: none given is `401`, another one `403`, and a router
//! with no token configured refuses every change with `403` (read-only).

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};

use super::error::ApiError;
use super::{Shared, ADMIN_TOKEN_ENV};

/// Proof that a request carries the admin token: a handler that takes it
/// runs only for such requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operator;

impl FromRequestParts<Shared> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, ApiError> {
        authorize(&parts.headers, state.token.as_deref())?;
        Ok(Operator)
    }
}

/// The text of the refusal a read-only router gives.
pub(crate) fn read_only_message() -> String {
    format!(
        "this keiro admin router is read-only: no admin token is configured, so operations \
         are refused; set {ADMIN_TOKEN_ENV} (or Admin::token) and send it as \
         `Authorization: Bearer TOKEN`"
    )
}

/// Whether `headers` carry `token` as a bearer token.
pub(crate) fn authorize(headers: &HeaderMap, token: Option<&str>) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "read_only",
            read_only_message(),
        ));
    };
    let Some(header) = headers.get(AUTHORIZATION) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this operation changes state and needs the admin token: send \
             `Authorization: Bearer TOKEN`",
        ));
    };
    let given = header
        .to_str()
        .ok()
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(given) if same(given.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the bearer token is not this router's admin token; nothing was changed",
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the Authorization header is not `Bearer TOKEN`; send the admin token as a bearer \
             token",
        )),
    }
}

/// Whether `a` equals `b`, in time that depends on their lengths only (not
/// on where they first differ), so a caller cannot find the token byte by
/// byte by timing refusals.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_the_configured_bearer_token_passes() {
        assert!(authorize(&with("Bearer s3cret"), Some("s3cret")).is_ok());
        let status = |r: Result<(), ApiError>| r.unwrap_err().status;
        assert_eq!(status(authorize(&HeaderMap::new(), Some("s3cret"))), 401);
        assert_eq!(
            status(authorize(&with("Basic s3cret"), Some("s3cret"))),
            401
        );
        assert_eq!(
            status(authorize(&with("Bearer s3cre"), Some("s3cret"))),
            403
        );
        assert_eq!(status(authorize(&with("Bearer s3cret"), None)), 403);
        assert!(read_only_message().contains(ADMIN_TOKEN_ENV));
    }
}
