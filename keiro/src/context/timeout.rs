//! The error a step attempt gets when it runs longer than its
//! `#[step(timeout_ms = ..)]`.

use std::time::Duration;

/// An attempt of a `#[step(timeout_ms = ..)]` ran longer than its limit and
/// was dropped. The step's error type converts it (`From<StepTimeout>`); the
/// attempt then counts as failed and is retried per `max_attempts`.
///
/// ```
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// enum FetchError {
///     Timeout(String),
///     Http(u16),
/// }
///
/// impl From<keiro::StepTimeout> for FetchError {
///     fn from(t: keiro::StepTimeout) -> Self {
///         FetchError::Timeout(t.to_string())
///     }
/// }
///
/// #[keiro::step(timeout_ms = 2000, max_attempts = 3)]
/// async fn fetch(url: String) -> Result<String, FetchError> {
///     Ok(url)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepTimeout {
    /// The step's journaled name.
    pub step: &'static str,
    /// Its `timeout_ms`.
    pub limit: Duration,
}

impl std::fmt::Display for StepTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step `{}` timed out after {} ms",
            self.step,
            self.limit.as_millis()
        )
    }
}

impl std::error::Error for StepTimeout {}

/// Steps whose error is a `String` get the timeout's message.
impl From<StepTimeout> for String {
    fn from(timeout: StepTimeout) -> String {
        timeout.to_string()
    }
}
