//! Recording how a run ended: finished, suspended, continued as new, stopped,
//! crashed (retried or failed at the attempt ceiling) or set aside for
//! non-determinism, and waking whoever waits on that.

use std::time::Duration;

use keiro_store::{
    ContinueAsNew, Crash, CreateRequest, Finish, FinishRequest, HandOver, InstanceRow,
    InstanceStatus, StepRow, StepTiming, Suspend,
};

use crate::registry::WorkflowOutput;
use crate::retry::retrying;
use crate::runtime::inflight::Slot;
use crate::shutdown::Stop;
use crate::time::duration_us;
use crate::{Error, Keiro, Result};

/// How a run of the workflow body ended.
pub(crate) enum Ended {
    /// The body returned this output.
    Returned(WorkflowOutput),
    /// The body returned a keiro error (its data no longer decodes, say).
    Errored(Error),
    /// The body panicked with this message.
    Panicked(String),
    /// The run halted with an error (non-determinism, a store failure).
    Aborted(Error),
    /// The run waits: until this time, for this step to be recorded, or for
    /// a message on this topic; the last is what it waits on, for listings.
    Suspended(
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<keiro_store::WaitingStep>,
    ),
    /// The run waits on several things (a `keiro::select!`): due at the
    /// first of them.
    SuspendedOnAny(crate::context::Wake),
    /// The runtime or worker is shutting down.
    Stopped,
    /// The instance was cancelled.
    Cancelled,
    /// The next generation starts with this input.
    ContinueAsNew(String),
    /// Another executor took the lease, or it could not be renewed before it
    /// may lapse.
    LeaseLost,
    /// The instance reached its deadline and was ended as timed out.
    TimedOut,
}

/// A queue slot to hand over when the run returns (see [`HandOver`]), and
/// the successor the hand-over claimed, which the caller then runs.
#[derive(Debug)]
pub(crate) struct HandingOver {
    hand_over: HandOver,
    /// Until when the run's lease surely holds (by this process's clock,
    /// with a margin), once the run returned: the slot is handed over only
    /// by a finish sent before then. Past it, a claim may have counted the
    /// slot free and filled it, and a hand-over would run one more than
    /// the queue's limit; the finish frees the slot instead.
    pub(crate) lease_holds_until: Option<tokio::time::Instant>,
    /// Set once the finish that handed the slot over is durable.
    pub(crate) successor: Option<InstanceRow>,
    /// The signals of the worker the run belongs to: one draining by the
    /// time the run returns starts no successor (it would take on new work
    /// it may have to stop and give back), and frees the slot instead.
    stop: Stop,
}

impl HandingOver {
    /// A hand-over as `hand_over` says, by a run of the worker `stop`
    /// signals, with no successor yet.
    pub(crate) fn new(hand_over: HandOver, stop: Stop) -> HandingOver {
        HandingOver {
            hand_over,
            lease_holds_until: None,
            successor: None,
            stop,
        }
    }

    /// The hand-over a finish sent now may make: none once the run's lease
    /// may have lapsed, its worker is draining, or this process's clock is
    /// off the server's (a hand-over leases by it).
    fn now(&self, keiro: &Keiro) -> Option<HandOver> {
        let live = self
            .lease_holds_until
            .is_none_or(|until| tokio::time::Instant::now() < until);
        (live && !self.stop.is_draining() && !keiro.clock_is_off()).then(|| self.hand_over.clone())
    }
}

/// Records `ended` for the claimed `row`: `Ok(Some(row))` when it finished or
/// suspended (or continued as new, or failed at the attempt ceiling),
/// `Ok(None)` when someone else's record stands, an error otherwise. A run
/// that returned hands its queue slot over as `handing` says, if given;
/// one that ended otherwise frees it.
pub(crate) async fn record(
    keiro: &Keiro,
    row: InstanceRow,
    ended: Ended,
    handing: Option<&mut HandingOver>,
    create: Option<CreateRequest>,
    steps: Vec<(StepRow, StepTiming)>,
) -> Result<Option<InstanceRow>> {
    let owner = keiro.owner();
    let store = keiro.raw_store();
    match ended {
        // Rows are queued only once the instance is recorded, so an
        // unrecorded one has none.
        Ended::Returned(output) => match create {
            Some(create) if steps.is_empty() => finish_unrecorded(keiro, row, output, create).await,
            Some(_) => Err(Error::Internal(format!(
                "workflow `{}` id `{}` queued step rows before its instance was recorded",
                row.name, row.id
            ))),
            None => finish(keiro, row, output, handing, steps).await,
        },
        Ended::Aborted(error @ Error::NonDeterministic { .. }) => {
            set_aside(keiro, &row, error).await
        }
        Ended::LeaseLost => Ok(None),
        // Recorded already by `Keiro::time_out`.
        Ended::TimedOut => {
            crate::telemetry::run_ended(&row.name, InstanceStatus::TimedOut.as_str());
            Ok(None)
        }
        Ended::Stopped => {
            crate::telemetry::run_ended(&row.name, "stopped");
            store.release(&row.id, owner).await?;
            Err(Error::Stopped {
                name: row.name,
                id: row.id,
            })
        }
        Ended::Suspended(wake_at, awaiting, topic, waiting) => {
            crate::telemetry::run_ended(&row.name, "suspended");
            let suspend = Suspend {
                id: &row.id,
                generation: row.generation,
                owner,
                wake_at,
                awaiting,
                waiting: waiting.as_ref(),
            };
            let applied = match &topic {
                Some(topic) => store.suspend_for_message(&suspend, topic).await?,
                None => store.suspend(&suspend).await?,
            };
            if !applied {
                return Ok(None);
            }
            let mut waiting = released(row);
            waiting.status = InstanceStatus::Suspended;
            waiting.wake_at = wake_at;
            Ok(Some(waiting))
        }
        Ended::SuspendedOnAny(wake) => {
            crate::telemetry::run_ended(&row.name, "suspended");
            let suspend = Suspend {
                id: &row.id,
                generation: row.generation,
                owner,
                wake_at: wake.wake_at,
                awaiting: None,
                waiting: wake.waiting.as_ref(),
            };
            if !store
                .suspend_for_any(&suspend, &wake.steps, &wake.topics)
                .await?
            {
                return Ok(None);
            }
            let mut waiting = released(row);
            waiting.status = InstanceStatus::Suspended;
            waiting.wake_at = wake.wake_at;
            Ok(Some(waiting))
        }
        // Recorded already by whoever cancelled it; the caller re-reads the row.
        Ended::Cancelled => {
            crate::telemetry::run_ended(&row.name, "cancelled");
            Ok(None)
        }
        Ended::ContinueAsNew(input) => {
            if !store
                .continue_as_new(&ContinueAsNew {
                    id: &row.id,
                    generation: row.generation,
                    owner,
                    input: &input,
                    app_version: Some(keiro.app_version()),
                })
                .await?
            {
                return Ok(None);
            }
            let mut next = released(row);
            next.generation += 1;
            next.input = input;
            next.status = InstanceStatus::Pending;
            next.wake_at = Some(keiro.now_us());
            Ok(Some(next))
        }
        // A value that cannot be journaled, or a transactional step whose
        // body ended keiro's transaction, is a bug in the workflow's code
        // that every attempt would hit again: fail it now, saying why (the
        // second could apply committed writes twice).
        Ended::Aborted(
            error @ (Error::NotJournalable { .. }
            | Error::PayloadTooLarge { .. }
            | Error::TransactionEnded { .. }),
        )
        | Ended::Errored(error @ (Error::NotJournalable { .. } | Error::PayloadTooLarge { .. })) => {
            fail(keiro, row, error).await
        }
        Ended::Aborted(error) | Ended::Errored(error) if error.is_transient() => {
            let _ = store.release(&row.id, owner).await;
            Err(error)
        }
        Ended::Aborted(error) | Ended::Errored(error) => {
            let message = error.to_string();
            crashed(keiro, row, message, error).await
        }
        Ended::Panicked(message) => {
            let error = Error::Panicked {
                name: row.name.clone(),
                id: row.id.clone(),
                message: message.clone(),
            };
            crashed(keiro, row, message, error).await
        }
    }
}

/// `row` with its lease given up, as the store now has it.
fn released(mut row: InstanceRow) -> InstanceRow {
    row.lease_owner = None;
    row.lease_expires_at = None;
    row
}

/// The finish recording `output`, what `row`'s body returned, under this
/// runtime's lease: completed, or failed for an `Err` output.
fn returned(keiro: &Keiro, row: &InstanceRow, output: &WorkflowOutput) -> FinishRequest {
    FinishRequest {
        id: row.id.clone(),
        generation: row.generation,
        owner: keiro.owner().to_owned(),
        status: match output.is_err {
            true => InstanceStatus::Failed,
            false => InstanceStatus::Completed,
        },
        output: Some(output.json.clone()),
        error: None,
    }
}

/// Records the body's output as the instance's end (an `Err` output fails
/// it) with the step rows its run journaled last (`steps`, in the same
/// transaction), handing its queue slot over as `handing` says, and wakes
/// its parent. `Ok(None)` when someone else finished it, took the lease or
/// journaled one of those steps first with another result: their record
/// wins.
async fn finish(
    keiro: &Keiro,
    row: InstanceRow,
    output: WorkflowOutput,
    handing: Option<&mut HandingOver>,
    steps: Vec<(StepRow, StepTiming)>,
) -> Result<Option<InstanceRow>> {
    let request = returned(keiro, &row, &output);
    let status = request.status;
    crate::telemetry::run_ended(&row.name, status.as_str());
    // Retried through an outage: a repeat after a first try that committed
    // finds its own rows and applies to nothing, and the caller then reads
    // the recorded end.
    let who = (row.name.as_str(), row.id.as_str());
    let writer = keiro.writer();
    let (finished, successor) = retrying(who, "recording a workflow's end", || {
        // Each try anew: one retried past the lease's lapse (or once the
        // worker drains) hands nothing over.
        let hand_over = handing.as_ref().and_then(|handing| handing.now(keiro));
        writer.finish_after_steps(request.clone(), hand_over, steps.clone())
    })
    .await
    .0?;
    if let Some(handing) = handing {
        handing.successor = successor;
    }
    if !finished {
        // A row of it another run journaled first stops the end, and this
        // run may still hold the lease (that run was a stale one): see
        // `release_overtaken`. Ended or leased to another, it matches
        // nothing.
        release_overtaken(keiro, &row.name, &row.id).await;
        return Ok(None);
    }
    let mut done = released(row);
    done.status = status;
    done.output = Some(output.json);
    wake_parent(keiro, &done).await;
    Ok(Some(done))
}

/// Releases the lease of run `name` `id` that a journal write found
/// overtaken (another run recorded one of its steps first), only while
/// this process holds it: that other run may have been a stale one of the
/// same instance, leaving this run the holder, and the instance then runs
/// on from its journal at once instead of after the lease lapses.
///
/// The release waits until the run has let go of the instance in this
/// process (its caller published or released it), and is made holding the
/// right to drive it here: a resume pass of this process that claims it
/// once it is released then runs it, where a pass claiming it in between
/// would have found it still driven here and left it to its lease. If a
/// run of this process drives it again by then, that run holds the lease,
/// and nothing is released. A failed release is logged: the lease then
/// lapses as it would have.
pub(super) async fn release_overtaken(keiro: &Keiro, name: &str, id: &str) {
    let Some(mut driven) = keiro.inflight().attach(id) else {
        release_lease(keiro, name, id).await;
        return;
    };
    let keiro = keiro.clone();
    let (name, id) = (name.to_owned(), id.to_owned());
    tokio::spawn(async move {
        // A result published, or the channel closed: the run let go. Past
        // the lease's length it has lapsed anyway.
        let let_go = driven.wait_for(|ended| ended.is_some());
        if tokio::time::timeout(keiro.lease_ttl(), let_go)
            .await
            .is_err()
        {
            return;
        }
        let Some(registered) = keiro.registry().get(&name).map(|r| r.name) else {
            return;
        };
        if let Slot::Mine(driving) = keiro.inflight().take(&id, registered) {
            release_lease(&keiro, &name, &id).await;
            keiro.inflight().release(driving);
        }
    });
}

/// Releases this process's lease of instance `id` (of workflow `name`), if
/// it holds it; a failure is logged.
async fn release_lease(keiro: &Keiro, name: &str, id: &str) {
    if let Err(error) = keiro.raw_store().release(id, keiro.owner()).await {
        tracing::warn!(
            name,
            id,
            %error,
            "keiro could not release the lease of a run another executor overtook"
        );
    }
}

/// Records an instance whose run returned before it was recorded (see
/// `crate::context::deferred`): inserted already ended, in one commit.
/// `Ok(None)` when another call recorded the id first (this run's end is
/// dropped; the caller follows that instance).
async fn finish_unrecorded(
    keiro: &Keiro,
    row: InstanceRow,
    output: WorkflowOutput,
    create: CreateRequest,
) -> Result<Option<InstanceRow>> {
    let request = returned(keiro, &row, &output);
    let status = request.status;
    let who = (row.name.as_str(), row.id.as_str());
    let (done, created) = retrying(who, "recording a workflow's end", || {
        keiro.writer().create_ended(create.clone(), request.clone())
    })
    .await
    .0?;
    if !created {
        return Ok(None);
    }
    crate::telemetry::run_ended(&done.name, status.as_str());
    Ok(Some(done))
}

/// Marks the instance failed with `error` as its diagnostic, without counting
/// a crash or journaling anything more, and wakes its parent. `Ok(None)` when
/// someone else finished it or took the lease.
async fn fail(keiro: &Keiro, row: InstanceRow, error: Error) -> Result<Option<InstanceRow>> {
    let message = error.to_string();
    tracing::error!(name = %row.name, id = %row.id, %message, "keiro failed a workflow");
    crate::telemetry::run_ended(&row.name, InstanceStatus::Failed.as_str());
    let finished = keiro
        .writer()
        .finish(FinishRequest {
            id: row.id.clone(),
            generation: row.generation,
            owner: keiro.owner().to_owned(),
            status: InstanceStatus::Failed,
            output: None,
            error: Some(message.clone()),
        })
        .await?;
    if !finished {
        return Ok(None);
    }
    let mut done = released(row);
    done.status = InstanceStatus::Failed;
    done.output = None;
    done.error = Some(message);
    wake_parent(keiro, &done).await;
    Ok(Some(done))
}

/// Tells a parent waiting in memory that its child's end was recorded: at
/// once in this process, by notification elsewhere (PostgreSQL).
async fn wake_parent(keiro: &Keiro, child: &InstanceRow) {
    if let Some(parent) = &child.parent_id {
        keiro.step_recorded(parent);
        if let Err(error) = keiro.raw_store().wake_workers(parent).await {
            tracing::debug!(%error, "keiro could not notify a parent's process");
        }
    }
}

/// Counts a crash; returns the failed row at the attempt ceiling, else `error`.
async fn crashed(
    keiro: &Keiro,
    mut row: InstanceRow,
    message: String,
    error: Error,
) -> Result<Option<InstanceRow>> {
    crate::telemetry::run_ended(&row.name, "crashed");
    let recorded = keiro
        .raw_store()
        .record_crash(&Crash {
            id: &row.id,
            owner: keiro.owner(),
            error: &message,
            max_attempts: i64::from(keiro.max_attempts()),
            retry_at: keiro.now_us() + duration_us(crash_backoff(row.attempts + 1)),
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
        .raw_store()
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

/// The delay before a crashed instance is tried again: 100 ms doubling per
/// attempt, at most a minute.
fn crash_backoff(attempts: i64) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempts.clamp(0, 10) as u32))
        .min(Duration::from_secs(60))
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::time::Duration;

    use keiro_store::{Lease, NewInstance};

    use super::release_overtaken;
    use crate::registry::{WorkflowInput, WorkflowOutput, WorkflowRegistration};
    use crate::runtime::inflight::Slot;
    use crate::{Keiro, Result};

    const NAME: &str = "end_tests_overtaken";

    fn never(_: WorkflowInput) -> futures::future::BoxFuture<'static, Result<WorkflowOutput>> {
        Box::pin(async { WorkflowOutput::encode(&(), false) })
    }

    fn unit() -> String {
        crate::signature::of::<(), ()>()
    }

    inventory::submit! {
        WorkflowRegistration::new(NAME, "end::tests::never", never, unit)
    }

    /// The lease holder of instance `id`.
    async fn holder(keiro: &Keiro, id: &str) -> Option<String> {
        let row = keiro.raw_store().get_instance(id).await.unwrap().unwrap();
        row.lease_owner
    }

    /// An overtaken run's lease is released only once the run let go of the
    /// instance in this process: a resume pass claiming it the moment it is
    /// released then finds nobody driving it here, and runs it, instead of
    /// leaving it to its lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_overtaken_runs_lease_is_released_once_the_run_let_go_here() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("end.db").display());
        let keiro = Keiro::builder(url).connect().await.unwrap();
        let owner = keiro.owner().to_owned();
        let lease = Lease {
            owner: &owner,
            ttl_us: 60_000_000,
        };
        let id = "overtaken";
        keiro
            .raw_store()
            .create_instance(&NewInstance {
                lease: Some(lease),
                ..NewInstance::new(id, NAME, "[]")
            })
            .await
            .unwrap();
        // The stopped run, still driving the instance here.
        let Slot::Mine(driving) = keiro.inflight().take(id, NAME) else {
            panic!("nobody drives {id} yet")
        };
        release_overtaken(&keiro, NAME, id).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(holder(&keiro, id).await.as_deref(), Some(owner.as_str()));
        assert!(matches!(keiro.inflight().take(id, NAME), Slot::Attached(_)));
        // The run lets go: the lease goes.
        keiro.inflight().release(driving);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while holder(&keiro, id).await.is_some() {
            assert!(std::time::Instant::now() < deadline, "the lease was kept");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // And nothing drives it here any more.
        let Slot::Mine(driving) = keiro.inflight().take(id, NAME) else {
            panic!("{id} is still driven here")
        };
        keiro.inflight().release(driving);
        keiro.shutdown().await.unwrap();
    }
}
