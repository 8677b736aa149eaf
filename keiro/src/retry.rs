//! Trying a store operation again through an outage (a restart or failover
//! of PostgreSQL): the pauses between tries, and how long the failures may
//! last in a row before the error is returned.

use std::future::Future;
use std::time::Duration;

use keiro_store::StoreError;

/// The first pause after a failure; each next one doubles, up to
/// [`MOST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between two tries.
const MOST_PAUSE: Duration = Duration::from_secs(1);

/// How long a run retries one of its journal writes that keeps failing
/// transiently before it stops with the error (its instance is then
/// released and resumed later from its journal).
const WRITE_THROUGH: Duration = Duration::from_secs(30);

/// Transient failures of one operation in a row.
#[derive(Debug)]
pub(crate) struct Outage {
    /// How long they may last before the error is returned.
    limit: Duration,
    /// When the first of them came.
    since: Option<tokio::time::Instant>,
    /// The pause before the next try.
    pause: Duration,
}

impl Outage {
    /// None yet; failures may last `limit` in a row.
    pub(crate) fn new(limit: Duration) -> Outage {
        Outage {
            limit,
            since: None,
            pause: Duration::ZERO,
        }
    }

    /// After a failure: waits before the next try and returns `true`, or
    /// returns `false` at once when the failure is not `transient` or the
    /// failures have lasted the limit.
    pub(crate) async fn wait_out(&mut self, transient: bool) -> bool {
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        if !transient || since.elapsed() >= self.limit {
            return false;
        }
        self.pause = (self.pause * 2).clamp(FIRST_PAUSE, MOST_PAUSE);
        tokio::time::sleep(self.pause).await;
        true
    }

    /// Whether an earlier try failed.
    pub(crate) fn failed_before(&self) -> bool {
        self.since.is_some()
    }
}

/// Calls `write` until it succeeds, fails with an error that is not
/// transient, the writer has stopped (the runtime is shutting down), or its
/// transient failures have lasted [`WRITE_THROUGH`]. The second value says
/// whether an earlier try failed (its write may still have committed).
///
/// Only for a run's reads, and its writes that are safe to repeat: a step
/// row is a conflict-handled insert (a repeat finds the row the first try
/// committed, and takes it as journaled), an instance's create is
/// create-or-read, and a finish applies only under the run's lease (a repeat
/// after a committed first try applies to nothing, and the run then reads
/// the end it recorded). A run whose lease may lapse meanwhile is stopped by its
/// driver, which drops this future: the retries never outlive the lease.
/// `name` and `id` are the workflow's, for the log.
pub(crate) async fn retrying<T, F, Fut>(
    (name, id): (&str, &str),
    what: &str,
    mut write: F,
) -> (Result<T, StoreError>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut outage = Outage::new(WRITE_THROUGH);
    loop {
        let error = match write().await {
            Err(error) => error,
            done => return (done, outage.failed_before()),
        };
        let transient = error.is_transient() && !matches!(error, StoreError::WriterStopped);
        if transient {
            tracing::warn!(%name, %id, %error, "keiro retries {what}");
        }
        if !outage.wait_out(transient).await {
            return (Err(error), outage.failed_before());
        }
    }
}
