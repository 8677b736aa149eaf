//! A run's own journal writes retried through a store outage (a restart or
//! failover of PostgreSQL), so a step whose body ran is not run again, and a
//! run that returned is not run again, just because the write of the result
//! met a lost connection.

use std::future::Future;
use std::time::Duration;

use keiro_store::StoreError;

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
/// journaled), an instance's create is create-or-read, and a finish applies
/// only under the run's lease (a repeat after a committed first try applies
/// to nothing, and the run then reads the end it recorded). A run whose
/// lease may lapse meanwhile is stopped by its driver, which drops this
/// future: the retries never outlive the lease. `name` and `id` are the
/// workflow's, for the log.
pub(crate) async fn retrying<T, F, Fut>(
    (name, id): (&str, &str),
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
        tracing::warn!(%name, %id, %error, "keiro retries {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MOST_PAUSE);
    }
}
