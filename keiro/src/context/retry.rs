//! A run's own journal writes retried through a store outage (a restart or
//! failover of PostgreSQL), so a step whose body ran is not run again just
//! because the write of its result met a lost connection.

use std::future::Future;
use std::time::Duration;

use keiro_store::StoreError;

use super::WorkflowContext;

/// How long a run retries one journal write that keeps failing transiently
/// before it stops with the error (its instance is then released and
/// resumed later from its journal).
const WRITE_THROUGH: Duration = Duration::from_secs(30);

/// The longest pause between two tries.
const MOST_PAUSE: Duration = Duration::from_secs(1);

/// Calls `write` until it succeeds, fails with an error that is not
/// transient, the writer has stopped (the runtime is shutting down), or its
/// transient failures have lasted [`WRITE_THROUGH`]. The second value says
/// whether an earlier try failed (its write may still have committed).
///
/// Only for writes that are safe to repeat: a step row is a conflict-handled
/// insert (a repeat finds the row the first try committed, and takes it as
/// journaled), an instance's create is create-or-read. A run whose lease may
/// lapse meanwhile is stopped by its driver, which drops this future: the
/// retries never outlive the lease.
pub(crate) async fn retrying<T, F, Fut>(
    cx: &WorkflowContext,
    what: &str,
    mut write: F,
) -> (Result<T, StoreError>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut failing_since = None;
    let mut pause = Duration::from_millis(50);
    loop {
        let error = match write().await {
            Err(error) if error.is_transient() && !matches!(error, StoreError::WriterStopped) => {
                error
            }
            other => return (other, failing_since.is_some()),
        };
        let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() >= WRITE_THROUGH {
            return (Err(error), true);
        }
        tracing::warn!(name = %cx.name, id = %cx.id, %error, "keiro retries {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MOST_PAUSE);
    }
}
