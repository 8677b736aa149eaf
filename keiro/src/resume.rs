//! The resume worker: finds unfinished instances that are due (crashed
//! mid-run, enqueued, or suspended past their wake time), claims each through
//! an expiring lease and drives it on through the link-time registry.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keiro_store::{BlockReason, InstanceRow, InstanceStatus, Lease};
use tokio::sync::watch;

use crate::runtime::inflight::Slot;
use crate::shutdown::{Phase, Stop};
use crate::workflow::drive::execute;
use crate::{Error, Keiro, Result};

/// What the worker reports to its log hook.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ResumeEvent {
    /// An instance names a workflow this binary does not register. It is
    /// skipped (never dropped or failed) and reported on every pass.
    UnknownName {
        /// The stored workflow name.
        name: String,
        /// The instance id.
        id: String,
    },
    /// An instance was started by a workflow of a name this binary registers,
    /// but with other argument or return types (another binary's workflow of
    /// that name, or this one before its types changed). It is skipped (never
    /// claimed, failed or counted as a crash) and reported on every pass.
    SignatureMismatch {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The signature recorded with the instance.
        stored: String,
        /// The signature of the workflow this binary registers under the name.
        registered: String,
    },
    /// The store failed while advancing an instance; it is retried next pass.
    TransientError {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// What failed.
        error: Error,
    },
    /// A run crashed (panicked, or its stored data no longer decodes); it is
    /// retried after a backoff.
    Crashed {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// Why.
        error: Error,
    },
    /// An instance reached its crash-attempt ceiling and is now failed.
    MarkedFailed {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The last crash.
        message: String,
    },
    /// A whole pass failed (discovery could not reach the store).
    PassFailed {
        /// What failed.
        error: Error,
    },
    /// A pass ended.
    Pass(ResumeSummary),
}

impl ResumeEvent {
    /// What went wrong, as a [`enum@Error`] (whose sentence says what to do):
    /// an unknown name is [`Error::UnknownWorkflow`], a signature mismatch
    /// [`Error::SignatureMismatch`], an instance marked failed
    /// [`Error::Failed`]; `None` for [`ResumeEvent::Pass`].
    pub fn error(&self) -> Option<Error> {
        match self {
            ResumeEvent::UnknownName { name, id } => Some(Error::UnknownWorkflow {
                name: name.clone(),
                id: id.clone(),
            }),
            ResumeEvent::SignatureMismatch {
                name,
                id,
                stored,
                registered,
            } => Some(Error::SignatureMismatch {
                name: name.clone(),
                id: id.clone(),
                stored: stored.clone(),
                requested: registered.clone(),
            }),
            ResumeEvent::MarkedFailed { name, id, message } => Some(Error::Failed {
                name: name.clone(),
                id: id.clone(),
                message: message.clone(),
            }),
            ResumeEvent::TransientError { error, .. }
            | ResumeEvent::Crashed { error, .. }
            | ResumeEvent::PassFailed { error } => Some(error.clone()),
            ResumeEvent::Pass(_) => None,
        }
    }
}

/// A hook receiving every [`ResumeEvent`].
pub type ResumeLog = Arc<dyn Fn(&ResumeEvent) + Send + Sync>;

/// Settings of the resume worker: what it does, not what an instance is.
/// The lease TTL and crash attempts of the instances it runs are the
/// runtime's ([`crate::KeiroBuilder::lease_ttl`],
/// [`crate::KeiroBuilder::max_attempts`]), so every process drives an
/// instance under the same policy.
///
/// Built from [`Default`] with chained setters (new settings may be added
/// without breaking callers):
///
/// ```
/// use std::time::Duration;
/// use keiro::ResumeOptions;
///
/// let options = ResumeOptions::default()
///     .concurrency(8)
///     .poll_interval(Duration::from_millis(200));
/// assert_eq!(options.concurrency, 8);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ResumeOptions {
    /// The pause between passes when nothing wakes the worker sooner
    /// (default 1 s; enqueues in this process and PostgreSQL notifications
    /// wake it at once).
    pub poll_interval: Duration,
    /// How many instances one worker advances at once (default 32).
    pub concurrency: usize,
    /// How many due instances one pass claims at most (default 512). A pass
    /// claims no more than twice `concurrency`, so claimed instances do not
    /// wait out their lease before they run; a full pass is followed at once
    /// by the next.
    pub batch_size: usize,
    /// Where events go (default: `tracing`).
    pub log: ResumeLog,
}

impl std::fmt::Debug for ResumeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeOptions")
            .field("poll_interval", &self.poll_interval)
            .field("concurrency", &self.concurrency)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl Default for ResumeOptions {
    fn default() -> Self {
        ResumeOptions {
            poll_interval: Duration::from_secs(1),
            concurrency: 32,
            batch_size: 512,
            log: Arc::new(log_to_tracing),
        }
    }
}

/// How many unclaimable due instances (unknown names, live foreign leases) a
/// pass reports.
const BLOCKED_REPORTED: i64 = 100;

impl ResumeOptions {
    /// Sets [`ResumeOptions::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets [`ResumeOptions::concurrency`].
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets [`ResumeOptions::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Sets [`ResumeOptions::log`].
    pub fn log(mut self, log: impl Fn(&ResumeEvent) + Send + Sync + 'static) -> Self {
        self.log = Arc::new(log);
        self
    }

    /// How many instances one pass claims.
    fn claim_limit(&self) -> i64 {
        self.batch_size
            .min(self.concurrency.saturating_mul(2))
            .max(1) as i64
    }

    /// Refuses settings the worker cannot run with.
    pub fn validate(&self) -> Result<()> {
        if self.poll_interval.is_zero() {
            return Err(Error::invalid_option(
                "ResumeOptions::poll_interval",
                "a zero poll interval would spin; use at least 1 ms (default 1 s)",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid_option(
                "ResumeOptions::concurrency",
                "a worker must advance at least one instance at once; use 1 or more (default 32)",
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::invalid_option(
                "ResumeOptions::batch_size",
                "a pass must claim at least one instance; use 1 or more (default 512)",
            ));
        }
        Ok(())
    }
}

fn log_to_tracing(event: &ResumeEvent) {
    match event {
        ResumeEvent::UnknownName { name, id } => tracing::warn!(
            %name, %id,
            "keiro resume worker: {}; skipping",
            Error::UnknownWorkflow { name: name.clone(), id: id.clone() }
        ),
        ResumeEvent::SignatureMismatch {
            name,
            id,
            stored,
            registered,
        } => tracing::warn!(
            %name, %id, %stored, %registered,
            "keiro resume worker: workflow `{name}` (id {id}) was started with types `{stored}`, \
             but this binary registers `{name}` with `{registered}`; skipping"
        ),
        ResumeEvent::TransientError { name, id, error } => {
            tracing::warn!(%name, %id, %error, "keiro resume worker: transient store error")
        }
        ResumeEvent::Crashed { name, id, error } => {
            tracing::warn!(%name, %id, %error, "keiro resume worker: workflow crashed; will retry")
        }
        ResumeEvent::MarkedFailed { name, id, message } => tracing::error!(
            %name, %id, %message,
            "keiro resume worker: workflow failed after its crash attempts"
        ),
        ResumeEvent::PassFailed { error } => {
            tracing::warn!(%error, "keiro resume worker: pass failed")
        }
        ResumeEvent::Pass(summary) => tracing::debug!(
            discovered = summary.discovered,
            resumed = summary.resumed,
            completed = summary.completed,
            still_suspended = summary.still_suspended,
            unknown_name = summary.unknown_name,
            failed = summary.failed,
            transient_errors = summary.transient_errors,
            lease_skipped = summary.lease_skipped,
            "keiro resume pass"
        ),
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumeSummary {
    /// Due instances found.
    pub discovered: usize,
    /// Instances claimed and re-invoked.
    pub resumed: usize,
    /// Re-invoked instances that finished (returned `Ok` or `Err`).
    pub completed: usize,
    /// Re-invoked instances that are waiting again.
    pub still_suspended: usize,
    /// Instances whose workflow name this binary does not register, or
    /// registers with other argument/return types.
    pub unknown_name: usize,
    /// Instances marked failed (crash ceiling) or set aside (non-determinism).
    pub failed: usize,
    /// Store errors; those instances are retried next pass.
    pub transient_errors: usize,
    /// Instances another executor holds a live lease on (or this process
    /// runs already).
    pub lease_skipped: usize,
}

impl ResumeSummary {
    fn add(mut self, other: ResumeSummary) -> ResumeSummary {
        self.discovered += other.discovered;
        self.resumed += other.resumed;
        self.completed += other.completed;
        self.still_suspended += other.still_suspended;
        self.unknown_name += other.unknown_name;
        self.failed += other.failed;
        self.transient_errors += other.transient_errors;
        self.lease_skipped += other.lease_skipped;
        self
    }
}

impl Keiro {
    /// One pass of the resume worker: discover due instances, claim and
    /// advance each, and report what happened. The single testable unit
    /// behind [`Keiro::resume_worker`].
    pub async fn resume_once(&self, options: &ResumeOptions) -> Result<ResumeSummary> {
        self.pass(options, &Stop::of(self)).await
    }

    /// One pass whose runs stop on `stop`.
    async fn pass(&self, options: &ResumeOptions, stop: &Stop) -> Result<ResumeSummary> {
        options.validate()?;
        self.ensure_executor().await?;
        self.serve_registered().await?;
        let store = self.raw_store();
        let owner = self.owner();
        let workflows = self.registry().workflows();
        let lease = Lease {
            owner,
            ttl_ms: self.lease_ttl().as_millis() as i64,
        };
        // Claim in the same statement that discovers, so concurrent workers
        // take disjoint batches instead of racing for the same rows.
        let claimed = store
            .claim_due(lease, &workflows, options.claim_limit())
            .await?;
        let blocked = store
            .find_blocked(owner, &workflows, BLOCKED_REPORTED)
            .await?;
        let mut summary = ResumeSummary {
            discovered: claimed.len() + blocked.len(),
            ..ResumeSummary::default()
        };
        for row in blocked {
            let (name, id) = (row.name, row.id);
            match row.reason {
                BlockReason::UnknownName => {
                    summary.unknown_name += 1;
                    (options.log)(&ResumeEvent::UnknownName { name, id });
                }
                BlockReason::SignatureMismatch { stored, registered } => {
                    summary.unknown_name += 1;
                    (options.log)(&ResumeEvent::SignatureMismatch {
                        name,
                        id,
                        stored,
                        registered,
                    });
                }
                _ => summary.lease_skipped += 1,
            }
        }
        let summary = futures::stream::iter(claimed)
            .map(|row| self.advance(row, options, stop.clone()))
            .buffer_unordered(options.concurrency)
            .fold(summary, |acc, one| async move { acc.add(one) })
            .await;
        crate::telemetry::pass(&summary);
        match store.count_pending_awakeables().await {
            Ok(n) => crate::telemetry::awakeables_pending(n),
            Err(error) => tracing::debug!(%error, "keiro could not count pending awakeables"),
        }
        (options.log)(&ResumeEvent::Pass(summary));
        Ok(summary)
    }

    /// Records (once per runtime) which workflow names this worker serves, so
    /// a caller waiting on an instance no live worker serves is told, and
    /// logs them: a workflow missing from this list was never linked into
    /// the binary (see [`crate::link!`]).
    async fn serve_registered(&self) -> Result<()> {
        self.serving()
            .get_or_try_init(|| async {
                let names = self.registry().names();
                self.raw_store()
                    .register_workflows(self.owner(), &names)
                    .await?;
                if names.is_empty() {
                    tracing::warn!(
                        executor = %self.owner(),
                        "keiro resume worker serves no workflow: none is linked into this binary \
                         (a crate of workflows that main never names is dropped by the linker; \
                         add `keiro::link!(that_crate);`)"
                    );
                } else {
                    tracing::info!(
                        executor = %self.owner(),
                        workflows = %names.join(", "),
                        "keiro resume worker serves {} workflow(s)",
                        names.len()
                    );
                }
                Ok::<_, Error>(())
            })
            .await
            .map(|_| ())
    }

    /// Drives one instance this pass claimed.
    async fn advance(
        &self,
        row: InstanceRow,
        options: &ResumeOptions,
        stop: Stop,
    ) -> ResumeSummary {
        let mut summary = ResumeSummary::default();
        if stop.is_halting() {
            // Claimed but not started when a shutdown halted the worker: hand
            // it back unstarted. (While draining, what a pass claimed runs.)
            let _ = self.raw_store().release(&row.id, self.owner()).await;
            return summary;
        }
        let Some(registration) = self.registry().get(&row.name) else {
            // Claimed by name, so registered; keep the guard all the same.
            summary.unknown_name = 1;
            let _ = self.raw_store().release(&row.id, self.owner()).await;
            return summary;
        };
        let driving = match self.inflight().take(&row.id, registration.name) {
            Slot::Mine(driving) => driving,
            // This process runs it already (under the same lease owner).
            Slot::Attached(_) | Slot::Conflict(_) => {
                summary.lease_skipped = 1;
                return summary;
            }
        };
        summary.resumed = 1;
        let (name, id) = (row.name.clone(), row.id.clone());
        let result = execute(self, registration.run, row, false, stop).await;
        match &result {
            Ok(Some(done)) => match done.status {
                InstanceStatus::Failed if done.output.is_none() => {
                    summary.failed = 1;
                    (options.log)(&ResumeEvent::MarkedFailed {
                        name: done.name.clone(),
                        id: done.id.clone(),
                        message: done.error.clone().unwrap_or_default(),
                    });
                }
                InstanceStatus::Suspended => summary.still_suspended = 1,
                _ => summary.completed = 1,
            },
            Ok(None) => summary.lease_skipped = 1,
            Err(Error::NonDeterministic { .. }) => summary.failed = 1,
            // Released by a clean shutdown; nothing to report.
            Err(Error::Stopped { .. }) => {}
            Err(error) if error.is_transient() => {
                summary.transient_errors = 1;
                (options.log)(&ResumeEvent::TransientError {
                    name: name.clone(),
                    id: id.clone(),
                    error: error.clone(),
                });
            }
            Err(error) => (options.log)(&ResumeEvent::Crashed {
                name: name.clone(),
                id: id.clone(),
                error: error.clone(),
            }),
        }
        match result {
            Ok(Some(done)) => self.inflight().publish(driving, Ok(done)),
            _ => self.inflight().release(driving),
        }
        summary
    }

    /// Starts the resume worker on the current tokio runtime with `options`
    /// (validated first). It runs a pass, then waits for the poll interval or
    /// a wake-up (an enqueue in this process; on PostgreSQL a notification
    /// from any process), until [`ResumeWorker::shutdown`] (or
    /// [`Keiro::shutdown`]).
    pub async fn resume_worker(&self, options: ResumeOptions) -> Result<ResumeWorker> {
        options.validate()?;
        self.ensure_executor().await?;
        let (phase, watched) = watch::channel(Phase::Running);
        self.listen_for_wakes();
        let keiro = self.clone();
        let join = tokio::spawn(async move {
            let mut stop = Stop::of_worker(&keiro, watched);
            loop {
                keiro.listen_for_wakes();
                let full = match keiro.pass(&options, &stop).await {
                    Ok(summary) => summary.resumed as i64 >= options.claim_limit(),
                    Err(error) => {
                        (options.log)(&ResumeEvent::PassFailed { error });
                        false
                    }
                };
                if stop.is_draining() {
                    break;
                }
                if full {
                    // More is due right now: no pause.
                    continue;
                }
                tokio::select! {
                    _ = tokio::time::sleep(options.poll_interval) => {}
                    _ = keiro.resume_wake().notified() => {}
                    _ = stop.draining() => break,
                }
            }
        });
        Ok(ResumeWorker {
            phase,
            join,
            keiro: self.clone(),
        })
    }
}

/// A running resume worker.
#[derive(Debug)]
pub struct ResumeWorker {
    phase: watch::Sender<Phase>,
    join: tokio::task::JoinHandle<()>,
    keiro: Keiro,
}

impl ResumeWorker {
    /// Shuts down promptly and cleanly: the worker claims nothing more, its
    /// runs in flight stop at once and release their leases (journal, status
    /// and attempts untouched), then its runtime is shut down with
    /// [`Keiro::shutdown`], which gives up the executor identity. Another
    /// worker resumes the released instances right away, and a new process
    /// may take the identity at once. Same as `shutdown_within(Duration::ZERO)`.
    pub async fn shutdown(self) {
        self.shutdown_within(Duration::ZERO).await
    }

    /// Like [`ResumeWorker::shutdown`], but first lets the runs in flight
    /// finish (or suspend) for up to `grace`; those still running then stop
    /// and release their leases.
    pub async fn shutdown_within(self, grace: Duration) {
        let keiro = self.keiro.clone();
        self.halt(grace).await;
        if let Err(error) = keiro.shutdown().await {
            tracing::warn!(%error, "keiro could not give up its executor identity; it lapses in 10 s");
        }
    }

    /// Stops this worker alone, as promptly as [`ResumeWorker::shutdown`]
    /// (its runs release their leases), keeping the runtime and its identity
    /// for workflows still run in this process.
    pub async fn stop(self) {
        self.halt(Duration::ZERO).await
    }

    async fn halt(mut self, grace: Duration) {
        let _ = self.phase.send(Phase::Draining);
        if grace.is_zero() || tokio::time::timeout(grace, &mut self.join).await.is_err() {
            let _ = self.phase.send(Phase::Halting);
            let _ = (&mut self.join).await;
        }
    }
}

/// Starts the resume worker of the process-wide runtime (from
/// `KEIRO_DATABASE_URL`) with default options, driving every workflow linked
/// into this binary. It logs at `info` which workflows it serves.
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> Result<(), keiro::Error> {
///     let worker = keiro::run_resume_worker().await?;
///     tokio::signal::ctrl_c().await.ok();
///     worker.shutdown().await;
///     Ok(())
/// }
/// ```
pub async fn run_resume_worker() -> Result<ResumeWorker> {
    crate::runtime::global()
        .await?
        .resume_worker(ResumeOptions::default())
        .await
}
