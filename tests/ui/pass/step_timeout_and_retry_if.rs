use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keiro::{step, StepTimeout};

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum FetchError {
    Timeout(String),
    NotFound,
}

impl From<StepTimeout> for FetchError {
    fn from(t: StepTimeout) -> Self {
        FetchError::Timeout(t.to_string())
    }
}

fn retryable(error: &FetchError) -> bool {
    !matches!(error, FetchError::NotFound)
}

static CALLS: AtomicU32 = AtomicU32::new(0);

/// Too slow every time: each attempt is cut off, then the timeout is the error.
#[step(timeout_ms = 20, max_attempts = 2, backoff_ms = 1)]
async fn slow(url: String) -> Result<String, FetchError> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(url)
}

/// Not found is final at once, whatever `max_attempts` says.
#[step(max_attempts = 5, backoff_ms = 1, retry_if = retryable)]
async fn missing(url: String) -> Result<String, FetchError> {
    CALLS.fetch_add(1, Ordering::SeqCst);
    drop(url);
    Err(FetchError::NotFound)
}

/// A `String` error takes a timeout's message.
#[step(timeout_ms = 1000)]
async fn quick(url: String) -> Result<String, String> {
    Ok(url)
}

#[tokio::main]
pub(crate) async fn main() {
    assert_eq!(
        slow("a".to_owned()).await,
        Err(FetchError::Timeout("step `slow` timed out after 20 ms".to_owned()))
    );
    assert_eq!(missing("b".to_owned()).await, Err(FetchError::NotFound));
    assert_eq!(CALLS.load(Ordering::SeqCst), 1);
    assert_eq!(quick("c".to_owned()).await, Ok("c".to_owned()));
}
