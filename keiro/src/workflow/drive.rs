//! Driving one workflow instance in this process: create or attach, claim,
//! replay-and-run under a renewed lease, and record how it ended.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use keiro_store::{
    now_ms, Crash, CreateRequest, Finish, FinishRequest, InstanceRow, InstanceStatus, Lease,
};
use tokio::sync::watch;
use tracing::Instrument;

use crate::context::{self, describe, Halt, WorkflowContext};
use crate::registry::{RunFn, WorkflowInput};
use crate::runtime::inflight::{RunResult, Slot};
use crate::shutdown::Stop;
use crate::{Error, Keiro, Result};

/// How often a caller waiting on an instance another executor holds looks again.
const ATTACH_POLL: Duration = Duration::from_millis(50);

/// What to run: a workflow by name and body, an id, its encoded arguments.
pub(crate) struct Launch {
    pub(crate) name: &'static str,
    pub(crate) run: RunFn,
    pub(crate) id: String,
    pub(crate) input: String,
    /// The workflow's signature (argument and return types).
    pub(crate) signature: String,
    /// The parent instance, its generation and its step seq, for a child.
    pub(crate) parent: Option<(String, i64, i64)>,
}

/// Records the instance (or finds the existing one with this id, which must
/// be the same call: see [`check_attach`]) and drives it to a final state in
/// a background task of this process. Returns at once with a receiver for the
/// final row. A second launch of an id this process is already driving
/// attaches to that run.
pub(crate) async fn launch(keiro: &Keiro, launch: Launch) -> Result<watch::Receiver<RunResult>> {
    keiro.ensure_executor().await?;
    let lease = Lease {
        owner: keiro.owner(),
        ttl_ms: keiro.lease_ttl().as_millis() as i64,
    };
    // Create-or-read first, even when this process drives the id already, so
    // every attach is checked against the stored call. Two launches racing
    // here run it once: only the one taking the slot below drives it, and a
    // claim by the same owner succeeds.
    let (row, fresh) = keiro
        .writer()
        .create(CreateRequest {
            id: launch.id.clone(),
            name: launch.name.to_owned(),
            input: launch.input.clone(),
            signature: Some(launch.signature.clone()),
            parent: launch.parent.clone(),
            lease: Some((lease.owner.to_owned(), lease.ttl_ms)),
        })
        .await?;
    check_attach(&row, &launch)?;
    let driving = match keiro.inflight().take(&launch.id, launch.name) {
        Slot::Mine(driving) => driving,
        Slot::Attached(receiver) => return Ok(receiver),
        Slot::Conflict(existing) => {
            return Err(Error::IdConflict {
                id: launch.id,
                existing: existing.to_owned(),
                requested: launch.name.to_owned(),
            })
        }
    };
    let receiver = driving.receiver();
    let keiro = keiro.clone();
    tokio::spawn(async move {
        let claimed = if fresh { Some(row) } else { None };
        let result = run_here(&keiro, launch.run, &launch.id, claimed).await;
        keiro.inflight().publish(driving, result);
    });
    Ok(receiver)
}

/// Refuses to attach `launch` to an existing instance `row` that is not the
/// same call: of another workflow name ([`Error::IdConflict`]), of a workflow
/// of this name with other types ([`Error::SignatureMismatch`]; rows from
/// before signatures were recorded match any), or started with other
/// arguments ([`Error::InputMismatch`]). The arguments compared are the
/// generation-0 ones, so continue-as-new does not refuse the original call.
pub(crate) fn check_attach(row: &InstanceRow, launch: &Launch) -> Result<()> {
    if row.name != launch.name {
        return Err(Error::IdConflict {
            id: launch.id.clone(),
            existing: row.name.clone(),
            requested: launch.name.to_owned(),
        });
    }
    if let Some(stored) = &row.signature {
        if *stored != launch.signature {
            return Err(Error::SignatureMismatch {
                name: row.name.clone(),
                id: row.id.clone(),
                stored: stored.clone(),
                requested: launch.signature.clone(),
            });
        }
    }
    if !same_json(row.original_input(), &launch.input) {
        return Err(Error::InputMismatch {
            name: row.name.clone(),
            id: row.id.clone(),
        });
    }
    Ok(())
}

/// Whether two JSON texts encode the same value. Equal texts are the common
/// case; otherwise they are compared parsed, so equal values whose text
/// differs (map keys in another order, say from a `HashMap`) still match.
fn same_json(stored: &str, new: &str) -> bool {
    stored == new
        || matches!(
            (
                serde_json::from_str::<serde_json::Value>(stored),
                serde_json::from_str::<serde_json::Value>(new),
            ),
            (Ok(a), Ok(b)) if a == b
        )
}

/// Waits for the end of an instance this process launched. A run that ended
/// with an error reports it; one that suspended (or lost its lease, or was
/// given up) is followed through the store, and driven here again when due.
pub(crate) async fn wait(
    keiro: &Keiro,
    id: &str,
    mut receiver: watch::Receiver<RunResult>,
    run: Option<RunFn>,
) -> Result<InstanceRow> {
    if let Ok(done) = receiver.wait_for(|r| r.is_some()).await {
        if let Some(result) = done.clone() {
            let row = result?;
            if row.status.is_final() {
                return Ok(row);
            }
        }
    }
    follow(keiro, id, run).await
}

/// Follows an instance until it is final. With `run`, this process drives it
/// whenever it is due and nobody else holds it (a suspended sleep that has
/// come due, a lapsed lease); without, it only watches.
pub(crate) async fn follow(keiro: &Keiro, id: &str, run: Option<RunFn>) -> Result<InstanceRow> {
    let waiter = keiro.waiter(id);
    let mut unserved = Unserved::default();
    loop {
        let changed = waiter.notified();
        let row = keiro
            .store()
            .get_instance(id)
            .await?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        if row.status.is_final() {
            return Ok(row);
        }
        if run.is_none() {
            unserved.check(keiro, &row).await?;
        }
        let wait = match row.wake_at {
            Some(wake_at) => (wake_at - now_ms()).max(0) as u64,
            None => u64::MAX,
        };
        if wait == 0 {
            if let Some(run) = run {
                let name = keiro
                    .registry()
                    .get(&row.name)
                    .map(|r| r.name)
                    .unwrap_or("");
                match keiro.inflight().take(id, name) {
                    Slot::Mine(driving) => {
                        let result = run_here(keiro, run, id, None).await;
                        let error = result.as_ref().err().cloned();
                        keiro.inflight().publish(driving, result);
                        if let Some(error) = error {
                            return Err(error);
                        }
                        continue;
                    }
                    Slot::Attached(mut receiver) => {
                        let _ = receiver.wait_for(|r| r.is_some()).await;
                        continue;
                    }
                    Slot::Conflict(_) => {}
                }
            }
        }
        let pause = Duration::from_millis(wait.clamp(1, ATTACH_POLL.as_millis() as u64));
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// How often a caller following an instance that no executor holds asks
/// whether any live worker serves its workflow.
const SERVED_CHECK: Duration = Duration::from_secs(1);

/// Tells a caller that follows an instance it does not drive when nothing
/// ever will: the instance is due, nobody holds it, and no live resume worker
/// has registered its workflow name for the runtime's `no_worker_timeout`.
#[derive(Default)]
struct Unserved {
    /// Since when the instance has been due and unserved.
    since: Option<tokio::time::Instant>,
    /// When the store was last asked.
    checked: Option<tokio::time::Instant>,
}

impl Unserved {
    async fn check(&mut self, keiro: &Keiro, row: &InstanceRow) -> Result<()> {
        let now_wall = now_ms();
        let waiting_for_a_worker = row.wake_at.is_some_and(|at| at <= now_wall)
            && row.lease_expires_at.map_or(true, |at| at <= now_wall);
        if !waiting_for_a_worker {
            *self = Unserved::default();
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        if self.checked.is_some_and(|at| now - at < SERVED_CHECK) {
            return Ok(());
        }
        self.checked = Some(now);
        let alive_since = now_wall - crate::runtime::identity::EXECUTOR_TTL.as_millis() as i64;
        if keiro.store().is_served(&row.name, alive_since).await? {
            self.since = None;
            return Ok(());
        }
        let since = *self.since.get_or_insert(now);
        let waited = now - since;
        if waited >= keiro.no_worker_timeout() {
            tracing::warn!(name = %row.name, id = %row.id, "keiro: no live worker serves this workflow");
            return Err(Error::NoWorker {
                name: row.name.clone(),
                id: row.id.clone(),
                waited,
            });
        }
        Ok(())
    }
}

/// Runs the instance once in this process: `claimed`, or whatever this
/// process can claim now. Returns the row as the run left it (final,
/// suspended, or held elsewhere).
async fn run_here(
    keiro: &Keiro,
    run: RunFn,
    id: &str,
    claimed: Option<InstanceRow>,
) -> Result<InstanceRow> {
    keiro.ensure_executor().await?;
    let policy = Policy::of(keiro);
    let fresh = claimed.is_some();
    let claimed = match claimed {
        Some(row) => Some(row),
        None => {
            let lease = Lease {
                owner: keiro.owner(),
                ttl_ms: policy.ttl.as_millis() as i64,
            };
            keiro.store().claim(id, lease).await?
        }
    };
    if let Some(row) = claimed {
        if let Some(done) = execute(keiro, run, row, fresh, policy, Stop::of(keiro)).await? {
            return Ok(done);
        }
    }
    keiro
        .store()
        .get_instance(id)
        .await?
        .ok_or_else(|| Error::NotFound { id: id.to_owned() })
}

enum Ended {
    Returned(crate::registry::WorkflowOutput),
    Errored(Error),
    Panicked(String),
    Aborted(Error),
    Suspended(Option<i64>, Option<i64>),
    Stopped,
    Cancelled,
    ContinueAsNew(String),
    LeaseLost,
}

/// How a run holds its lease and counts its crashes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub(crate) ttl: Duration,
    pub(crate) max_attempts: u32,
}

impl Policy {
    /// The runtime's own settings, for runs started in this process.
    pub(crate) fn of(keiro: &Keiro) -> Policy {
        Policy {
            ttl: keiro.lease_ttl(),
            max_attempts: keiro.max_attempts(),
        }
    }
}

/// The delay before a crashed instance is tried again: 100 ms doubling per
/// attempt, at most a minute.
fn crash_backoff(attempts: i64) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempts.clamp(0, 10) as u32))
        .min(Duration::from_secs(60))
}

/// One invocation: read the journal once (none for a fresh instance), run the
/// body with its context, and record the end: `Ok(Some(row))` when it finished
/// or suspended, `Ok(None)` when the lease was lost to another executor.
///
/// A panic, or an error in the workflow's own data (an input or result that no
/// longer decodes), is a crash: counted against the instance's attempts, which
/// is retried later or, at `policy.max_attempts`, marked failed (returned as a
/// final row). A store error is transient: the lease is released and nothing
/// is counted. So is a clean shutdown (`stop`), which ends the run with
/// [`Error::Stopped`].
pub(crate) async fn execute(
    keiro: &Keiro,
    run: RunFn,
    row: InstanceRow,
    fresh: bool,
    policy: Policy,
    mut stop: Stop,
) -> Result<Option<InstanceRow>> {
    let store = keiro.store();
    let owner = keiro.owner();
    let journal = if fresh {
        Vec::new()
    } else {
        store.load_journal(&row.id, row.generation).await?
    };
    let (cx, mut aborted) = WorkflowContext::new(
        keiro.clone(),
        row.name.clone(),
        row.id.clone(),
        row.generation,
        journal,
    );
    let _live = keiro.inflight().enter(&cx);
    let input = WorkflowInput {
        name: row.name.clone(),
        id: row.id.clone(),
        json: row.input.clone(),
    };
    let span = tracing::info_span!(
        "keiro.workflow",
        name = %row.name,
        id = %row.id,
        generation = row.generation
    );
    // Boxed so it can be dropped (ending the workflow's future) before the
    // end is recorded.
    let mut body = Box::pin(
        context::scope(
            Some(cx.clone()),
            AssertUnwindSafe(run(input)).catch_unwind(),
        )
        .instrument(span.clone()),
    );
    let ttl = policy.ttl;
    let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + ttl / 3, ttl / 3);
    let lease = Lease {
        owner,
        ttl_ms: ttl.as_millis() as i64,
    };
    let ended = loop {
        tokio::select! {
            biased;
            halt = &mut aborted => {
                break match halt {
                    Ok(Halt::Error(error)) => Ended::Aborted(error),
                    Ok(Halt::Suspend { wake_at, awaiting }) => Ended::Suspended(wake_at, awaiting),
                    Ok(Halt::Cancelled) => Ended::Cancelled,
                    Ok(Halt::ContinueAsNew { input }) => Ended::ContinueAsNew(input),
                    Err(_) => Ended::Errored(Error::Config("workflow context dropped".into())),
                };
            }
            out = &mut body => {
                break match out {
                    Ok(Ok(output)) => Ended::Returned(output),
                    Ok(Err(error)) => Ended::Errored(error),
                    Err(panic) => Ended::Panicked(panic_message(panic.as_ref())),
                };
            }
            _ = stop.wait() => break Ended::Stopped,
            _ = renew.tick() => {
                match store.renew_lease(&row.id, lease).await {
                    Ok(true) => {}
                    Ok(false) => break Ended::LeaseLost,
                    Err(error) => tracing::warn!(parent: &span, %error, "keiro could not renew a lease; retrying"),
                }
            }
        }
    };
    drop(body);
    match ended {
        Ended::Returned(output) => {
            if let Some(unreached) = cx.first_recorded_from(cx.allocated()) {
                let error = cx.non_deterministic(
                    unreached.seq,
                    &unreached,
                    "the workflow returning before it".to_owned(),
                );
                return set_aside(keiro, &row, error).await;
            }
            let status = if output.is_err {
                InstanceStatus::Failed
            } else {
                InstanceStatus::Completed
            };
            crate::telemetry::run_ended(&row.name, status.as_str());
            let finished = keiro
                .writer()
                .finish(FinishRequest {
                    id: row.id.clone(),
                    generation: row.generation,
                    owner: owner.to_owned(),
                    status,
                    output: Some(output.json.clone()),
                    error: None,
                })
                .await?;
            if finished {
                let mut done = row;
                done.status = status;
                done.output = Some(output.json);
                done.lease_owner = None;
                done.lease_expires_at = None;
                wake_parent(keiro, &done).await;
                return Ok(Some(done));
            }
            // Someone else finished it or took the lease: their record wins.
            Ok(None)
        }
        Ended::Aborted(error @ Error::NonDeterministic { .. }) => {
            set_aside(keiro, &row, error).await
        }
        Ended::LeaseLost => Ok(None),
        Ended::Stopped => {
            crate::telemetry::run_ended(&row.name, "stopped");
            store.release(&row.id, owner).await?;
            Err(Error::Stopped {
                name: row.name,
                id: row.id,
            })
        }
        Ended::Suspended(wake_at, awaiting) => {
            crate::telemetry::run_ended(&row.name, "suspended");
            if !store
                .suspend(&row.id, row.generation, owner, wake_at, awaiting)
                .await?
            {
                return Ok(None);
            }
            let mut waiting = row;
            waiting.status = InstanceStatus::Suspended;
            waiting.wake_at = wake_at;
            waiting.lease_owner = None;
            waiting.lease_expires_at = None;
            Ok(Some(waiting))
        }
        // Recorded already by whoever cancelled it; the caller re-reads the row.
        Ended::Cancelled => {
            crate::telemetry::run_ended(&row.name, "cancelled");
            Ok(None)
        }
        Ended::ContinueAsNew(input) => {
            if !store
                .continue_as_new(&row.id, row.generation, owner, &input)
                .await?
            {
                return Ok(None);
            }
            let mut next = row;
            next.generation += 1;
            next.input = input;
            next.status = InstanceStatus::Pending;
            next.wake_at = Some(now_ms());
            next.lease_owner = None;
            next.lease_expires_at = None;
            Ok(Some(next))
        }
        Ended::Aborted(error) | Ended::Errored(error) if error.is_transient() => {
            let _ = store.release(&row.id, owner).await;
            Err(error)
        }
        Ended::Aborted(error) | Ended::Errored(error) => {
            let message = error.to_string();
            crashed(keiro, row, policy, message, error).await
        }
        Ended::Panicked(message) => {
            tracing::error!(parent: &span, %message, "keiro workflow panicked");
            let error = Error::Panicked {
                name: row.name.clone(),
                id: row.id.clone(),
                message: message.clone(),
            };
            crashed(keiro, row, policy, message, error).await
        }
    }
}

/// Tells a parent waiting in memory that its child's end was recorded: at
/// once in this process, by notification elsewhere (PostgreSQL).
async fn wake_parent(keiro: &Keiro, child: &InstanceRow) {
    if let Some(parent) = &child.parent_id {
        keiro.step_recorded(parent);
        if let Err(error) = keiro.store().wake_workers(parent).await {
            tracing::debug!(%error, "keiro could not notify a parent's process");
        }
    }
}

/// Counts a crash; returns the failed row at the attempt ceiling, else `error`.
async fn crashed(
    keiro: &Keiro,
    mut row: InstanceRow,
    policy: Policy,
    message: String,
    error: Error,
) -> Result<Option<InstanceRow>> {
    crate::telemetry::run_ended(&row.name, "crashed");
    let recorded = keiro
        .store()
        .record_crash(&Crash {
            id: &row.id,
            owner: keiro.owner(),
            error: &message,
            max_attempts: i64::from(policy.max_attempts),
            retry_at: now_ms() + crash_backoff(row.attempts + 1).as_millis() as i64,
        })
        .await?;
    match recorded {
        Some((InstanceStatus::Failed, attempts)) => {
            wake_parent(keiro, &row).await;
            tracing::error!(name = %row.name, id = %row.id, attempts, %message, "keiro marked a workflow failed after its crash attempts");
            row.status = InstanceStatus::Failed;
            row.attempts = attempts;
            row.error = Some(message);
            row.output = None;
            Ok(Some(row))
        }
        _ => Err(error),
    }
}

/// Records non-determinism without touching the journal and reports it.
async fn set_aside(keiro: &Keiro, row: &InstanceRow, error: Error) -> Result<Option<InstanceRow>> {
    let Error::NonDeterministic {
        seq,
        expected,
        found,
        ..
    } = &error
    else {
        return Err(error);
    };
    let diagnostic = serde_json::json!({ "seq": seq, "expected": expected, "found": found });
    tracing::error!(name = %row.name, id = %row.id, %error, "keiro set a workflow aside");
    crate::telemetry::run_ended(&row.name, "set_aside");
    keiro
        .store()
        .finish(&Finish {
            id: &row.id,
            generation: row.generation,
            owner: keiro.owner(),
            status: InstanceStatus::NonDeterministic,
            output: None,
            error: Some(&diagnostic.to_string()),
        })
        .await?;
    Err(error)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Turns a final row into what the caller sees: the decoded output, or the
/// error that ended it.
pub(crate) fn outcome_of<R: serde::de::DeserializeOwned>(row: &InstanceRow) -> Result<R> {
    match (row.status, &row.output) {
        (InstanceStatus::Completed | InstanceStatus::Failed, Some(output)) => {
            serde_json::from_str(output).map_err(|e| {
                Error::decode(
                    format!(
                        "the stored output of workflow `{}` (id {}) into the requested type",
                        row.name, row.id
                    ),
                    e,
                )
            })
        }
        (InstanceStatus::Cancelled, _) => Err(Error::Cancelled {
            name: row.name.clone(),
            id: row.id.clone(),
        }),
        (InstanceStatus::NonDeterministic, _) => {
            let (seq, expected, found) = nondeterminism_of(row);
            Err(Error::NonDeterministic {
                name: row.name.clone(),
                id: row.id.clone(),
                seq,
                expected,
                found,
            })
        }
        _ => Err(Error::Failed {
            name: row.name.clone(),
            id: row.id.clone(),
            message: row
                .error
                .clone()
                .unwrap_or_else(|| format!("it is {}", row.status.as_str())),
        }),
    }
}

/// The stored diagnostic of a set-aside instance: (seq, expected, found).
pub(crate) fn nondeterminism_of(row: &InstanceRow) -> (i64, String, String) {
    let parsed: Option<serde_json::Value> = row
        .error
        .as_deref()
        .and_then(|e| serde_json::from_str(e).ok());
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    (
        parsed
            .as_ref()
            .and_then(|v| v.get("seq"))
            .and_then(|v| v.as_i64())
            .unwrap_or(-1),
        field("expected").unwrap_or_else(|| describe("step", "?")),
        field("found").unwrap_or_else(|| row.error.clone().unwrap_or_default()),
    )
}

/// A context shared by a parent and the child calls it makes.
pub(crate) type ParentSlot = Option<(Arc<WorkflowContext>, i64)>;
