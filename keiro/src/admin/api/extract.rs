//! axum's `Json` and `Query` extractors, refusing with our JSON error
//! ([`ApiError`]) instead of axum's plain text.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::admin::error::ApiError;

/// A JSON request body (`Content-Type: application/json`).
#[derive(Debug)]
pub(crate) struct Body<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(value) = axum::Json::<T>::from_request(request, state).await?;
        Ok(Body(value))
    }
}

/// The query string's parameters.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Params(value))
    }
}

/// The `{id}` of the route, percent-decoded (`parent%2F3` is `parent/3`).
#[derive(Debug)]
pub(crate) struct Id(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(id) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|rejection| {
                    ApiError::bad_request("invalid_path", rejection.body_text())
                })?;
        Ok(Id(id))
    }
}
