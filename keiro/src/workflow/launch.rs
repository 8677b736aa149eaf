//! Starting or joining a run of an instance in this process: record the
//! call (or check it against the recorded one), take the right to drive it,
//! and follow it to its end, driving it again whenever it comes due here.

use std::time::Duration;

use keiro_store::{now_us, CreateRequest, InstanceRow, InstanceStatus, Lease};
use tokio::sync::watch;

use super::drive::{execute, run_here};
use crate::registry::RunFn;
use crate::retry::Outage;
use crate::runtime::inflight::{RunResult, Slot};
use crate::shutdown::Stop;
use crate::time::{duration_us, until_us};
use crate::{Error, Keiro, Result};

/// How often a caller waiting on an instance another executor holds looks again.
const ATTACH_POLL: Duration = Duration::from_millis(50);

/// How often a caller following an instance that waits on its named queue
/// reads it again without being woken.
const QUEUED_POLL: Duration = Duration::from_secs(1);

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
    /// When the instance times out (µs since the Unix epoch), if ever.
    pub(crate) deadline: Option<i64>,
    /// The trace its runs continue: the caller's span's `traceparent`.
    pub(crate) traceparent: Option<String>,
    /// The application version of the creating runtime.
    pub(crate) app_version: String,
    /// The step-call skeleton hash of the workflow's code in this binary.
    pub(crate) skeleton_hash: Option<&'static str>,
}

impl Launch {
    /// The writer's request recording this call, leased to `lease` (owner,
    /// TTL in µs) or pending for any worker.
    pub(crate) fn create_request(&self, lease: Option<(String, i64)>) -> CreateRequest {
        CreateRequest {
            id: self.id.clone(),
            name: self.name.to_owned(),
            input: self.input.clone(),
            signature: Some(self.signature.clone()),
            parent: self.parent.clone(),
            lease,
            deadline: self.deadline,
            traceparent: self.traceparent.clone(),
            app_version: Some(self.app_version.clone()),
            skeleton_hash: self.skeleton_hash.map(str::to_owned),
        }
    }

    /// The instance to record, pending for any worker (an enqueue).
    pub(crate) fn new_instance(&self) -> keiro_store::NewInstance<'_> {
        keiro_store::NewInstance {
            id: &self.id,
            name: self.name,
            input: &self.input,
            signature: Some(&self.signature),
            parent: self
                .parent
                .as_ref()
                .map(|(id, generation, seq)| keiro_store::ParentLink {
                    id,
                    generation: *generation,
                    seq: *seq,
                }),
            lease: None,
            deadline: self.deadline,
            traceparent: self.traceparent.as_deref(),
            app_version: Some(&self.app_version),
            skeleton_hash: self.skeleton_hash,
        }
    }
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
        ttl_us: duration_us(keiro.lease_ttl()),
    };
    // Create-or-read first, even when this process drives the id already, so
    // every attach is checked against the stored call. Two launches racing
    // here run it once: only the one taking the slot below drives it, and a
    // claim by the same owner succeeds.
    let (row, fresh) = keiro
        .writer()
        .create(launch.create_request(Some((lease.owner.to_owned(), lease.ttl_us))))
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
                held_as: String::new(),
                requested_as: String::new(),
            })
        }
    };
    let receiver = driving.receiver();
    let keiro = keiro.clone();
    tokio::spawn(async move {
        // Created just now: no journal to read.
        let claimed = fresh.then_some(InstanceRow { fresh: true, ..row });
        let result = run_here(&keiro, launch.run, &launch.id, claimed).await;
        keiro.inflight().publish(driving, result);
    });
    Ok(receiver)
}

/// [`launch`] of a call awaited in this process with neither a parent nor a
/// deadline, which may start before its instance is recorded (see
/// `crate::context::deferred`): a run that returns before any step records
/// its instance already ended, in one commit instead of two. Takes the
/// right to drive the id here and runs it in a background task; when another
/// call recorded the id first, that run stops and the task follows that
/// instance as [`launch`] would have (checking it is the same call). Gives
/// the call back when this process drives the id already: [`launch`]
/// attaches to that run.
pub(crate) async fn launch_deferred(
    keiro: &Keiro,
    launch: Launch,
) -> Result<std::result::Result<watch::Receiver<RunResult>, Launch>> {
    keiro.ensure_executor().await?;
    let driving = match keiro.inflight().take(&launch.id, launch.name) {
        Slot::Mine(driving) => driving,
        Slot::Attached(_) | Slot::Conflict(_) => return Ok(Err(launch)),
    };
    let receiver = driving.receiver();
    let keiro = keiro.clone();
    tokio::spawn(async move {
        let result = run_deferred(&keiro, &launch).await;
        keiro.inflight().publish(driving, result);
    });
    Ok(Ok(receiver))
}

/// Runs `launch` with its create deferred; follows the instance that holds
/// the id instead when another call recorded it first.
async fn run_deferred(keiro: &Keiro, launch: &Launch) -> Result<InstanceRow> {
    let owner = keiro.owner().to_owned();
    let ttl_us = duration_us(keiro.lease_ttl());
    let now = keiro.now_us();
    // Deferred only without a parent or a deadline (see `launch_deferred`).
    let create = launch.create_request(Some((owner.clone(), ttl_us)));
    // The row that create makes, leased to this process.
    let row = InstanceRow {
        id: launch.id.clone(),
        name: launch.name.to_owned(),
        generation: 0,
        status: InstanceStatus::Running,
        input: launch.input.clone(),
        first_input: None,
        signature: Some(launch.signature.clone()),
        output: None,
        error: None,
        attempts: 0,
        lease_owner: Some(owner),
        lease_expires_at: Some(now + ttl_us),
        wake_at: Some(now + ttl_us),
        parent_id: None,
        parent_seq: None,
        deadline: None,
        traceparent: launch.traceparent.clone(),
        app_version: Some(launch.app_version.clone()),
        skeleton_hash: launch.skeleton_hash.map(str::to_owned),
        created_at: now,
        updated_at: now,
        fresh: true,
    };
    let stop = Stop::of(keiro);
    let ran = execute(keiro, launch.run, row, stop, None, Some(create)).await?;
    if let Some(done) = ran {
        return Ok(done);
    }
    // Another call recorded the id first (or this run lost its lease).
    let existing = keiro
        .raw_store()
        .get_instance(&launch.id)
        .await?
        .ok_or_else(|| Error::NotFound {
            id: launch.id.clone(),
        })?;
    check_attach(&existing, launch)?;
    run_here(keiro, launch.run, &launch.id, None).await
}

/// Refuses to attach `launch` to an existing instance `row` that is not the
/// same call: of another workflow name ([`Error::IdConflict`]), not the child
/// this call makes ([`Error::IdConflict`], see [`check_parent`]), of a
/// workflow of this name with other types ([`Error::SignatureMismatch`]; rows
/// from before signatures were recorded match any), or started with other
/// arguments ([`Error::InputMismatch`]). The arguments compared are the
/// generation-0 ones, so continue-as-new does not refuse the original call.
pub(crate) fn check_attach(row: &InstanceRow, launch: &Launch) -> Result<()> {
    if row.name != launch.name {
        return Err(Error::IdConflict {
            id: launch.id.clone(),
            existing: row.name.clone(),
            requested: launch.name.to_owned(),
            held_as: String::new(),
            requested_as: String::new(),
        });
    }
    let same_input = same_json(row.original_input(), &launch.input);
    check_parent(row, launch, same_input)?;
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
    if !same_input {
        return Err(Error::InputMismatch {
            name: row.name.clone(),
            id: row.id.clone(),
        });
    }
    Ok(())
}

/// A child's identity includes its parent link. A parent's child call
/// attaches only to the instance it (an earlier run of it) created: one
/// started outside any workflow, or as another parent's child, under that id
/// would never report to this parent (which would wait forever), and its
/// result is its own caller's. An outside call attaches to a child instance
/// only as the same call (same name, types and arguments), like any reused
/// id: it reads the result the child's call gets; with other arguments it is
/// not that call at all.
fn check_parent(row: &InstanceRow, launch: &Launch, same_input: bool) -> Result<()> {
    let held = row.parent_id.as_deref().zip(row.parent_seq);
    let conflict = match (&launch.parent, held) {
        (Some((parent, _, seq)), Some((held_parent, held_seq))) => {
            parent != held_parent || *seq != held_seq
        }
        (Some(_), None) => true,
        (None, Some(_)) => !same_input,
        (None, None) => false,
    };
    if !conflict {
        return Ok(());
    }
    let held_as = match held {
        Some((parent, seq)) => {
            format!(" as the child at step {seq} of workflow instance `{parent}`")
        }
        None => " started outside any workflow".to_owned(),
    };
    let requested_as = match &launch.parent {
        Some((parent, _, seq)) => {
            format!(" as the child at step {seq} of workflow instance `{parent}`")
        }
        None => " from outside any workflow with other arguments".to_owned(),
    };
    Err(Error::IdConflict {
        id: launch.id.clone(),
        existing: row.name.clone(),
        requested: launch.name.to_owned(),
        held_as,
        requested_as,
    })
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
///
/// The store going away for a while (a restart, a failover) does not end
/// the wait: its reads are retried while they fail transiently, for up to
/// [`FOLLOW_THROUGH`] in a row.
pub(crate) async fn follow(keiro: &Keiro, id: &str, run: Option<RunFn>) -> Result<InstanceRow> {
    let waiter = keiro.waiter(id);
    let mut unserved = Unserved::default();
    let mut outage = Outage::new(FOLLOW_THROUGH);
    loop {
        let changed = waiter.notified();
        let read = async {
            let row = keiro
                .raw_store()
                .get_instance(id)
                .await?
                .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
            if !row.status.is_final() && run.is_none() {
                unserved.check(keiro, &row).await?;
            }
            Ok::<_, Error>(row)
        };
        let row = match read.await {
            Ok(row) => {
                outage = Outage::new(FOLLOW_THROUGH);
                row
            }
            Err(error) => {
                tracing::debug!(%error, "keiro retries reading a followed instance");
                if outage.wait_out(error.is_transient()).await {
                    continue;
                }
                return Err(error);
            }
        };
        if row.status.is_final() {
            return Ok(row);
        }
        let wait = match row.wake_at {
            Some(wake_at) => until_us(wake_at, keiro.now_us()),
            None => Duration::MAX,
        };
        if wait.is_zero() {
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
                        // Due, yet not claimed here: it is on a named queue,
                        // whose own claim starts it within the limits.
                        let not_here = result.as_ref().is_ok_and(|row| {
                            !row.status.is_final()
                                && row.lease_owner.is_none()
                                && row.wake_at.is_some_and(|at| at <= keiro.now_us())
                        });
                        keiro.inflight().publish(driving, result);
                        if let Some(error) = error {
                            return Err(error);
                        }
                        if not_here {
                            // Its end (or start elsewhere) wakes this wait.
                            tokio::select! {
                                _ = changed => {}
                                _ = tokio::time::sleep(QUEUED_POLL) => {}
                            }
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
        let pause = wait.clamp(Duration::from_millis(1), ATTACH_POLL);
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// How long a caller following an instance keeps reading through transient
/// store errors in a row (a failover of PostgreSQL takes seconds to tens of
/// seconds) before it returns the error.
pub(crate) const FOLLOW_THROUGH: Duration = Duration::from_secs(60);

/// How often a caller following an instance that no executor holds asks
/// whether any live worker serves its workflow.
const SERVED_CHECK: Duration = Duration::from_secs(1);

/// Tells a caller that follows an instance it does not drive when nothing
/// ever will: the instance is due, nobody holds it, and no live resume worker
/// has registered its workflow name (or, on a named queue, that queue) for
/// the runtime's `no_worker_timeout`.
#[derive(Default)]
struct Unserved {
    /// Since when the instance has been due and unserved.
    since: Option<tokio::time::Instant>,
    /// When the store was last asked.
    checked: Option<tokio::time::Instant>,
}

impl Unserved {
    async fn check(&mut self, keiro: &Keiro, row: &InstanceRow) -> Result<()> {
        let due_by = keiro.now_us();
        let waiting_for_a_worker = row.wake_at.is_some_and(|at| at <= due_by)
            && row.lease_expires_at.is_none_or(|at| at <= due_by);
        if !waiting_for_a_worker {
            *self = Unserved::default();
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        if self.checked.is_some_and(|at| now - at < SERVED_CHECK) {
            return Ok(());
        }
        self.checked = Some(now);
        // Liveness is real time whatever the runtime's clock (heartbeats are).
        let alive_since = now_us() - duration_us(crate::runtime::identity::EXECUTOR_TTL);
        let store = keiro.raw_store();
        let unserved = match store.is_served(&row.name, alive_since).await? {
            // Served, unless on a queue no worker serving it claims from.
            true => match store.queue_unserved(&row.id, alive_since).await? {
                Some(queue) => Some(queue),
                None => {
                    self.since = None;
                    return Ok(());
                }
            },
            false => None,
        };
        let since = *self.since.get_or_insert(now);
        let waited = now - since;
        if waited < keiro.no_worker_timeout() {
            return Ok(());
        }
        let (name, id) = (row.name.clone(), row.id.clone());
        Err(match unserved {
            Some(queue) => {
                tracing::warn!(%name, %id, %queue, "keiro: no live worker claims from this queue");
                Error::NoQueueWorker {
                    queue,
                    name,
                    id,
                    waited,
                }
            }
            None => {
                tracing::warn!(%name, %id, "keiro: no live worker serves this workflow");
                Error::NoWorker { name, id, waited }
            }
        })
    }
}
