//! Driving one claimed instance in this process: read its journal once, run
//! the workflow body under a renewed lease until it returns or halts, then
//! hand how it ended to [`super::end`] to record.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use keiro_store::{InstanceRow, Lease, StepRow, StepTiming};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::end::{self, Ended, HandingOver};
use super::lapsed_lease;
use crate::context::{self, Halt, WorkflowContext};
use crate::panic::panic_message;
use crate::registry::{RunFn, WorkflowInput};
use crate::shutdown::Stop;
use crate::time::{duration_us, until_us};
use tokio::time::Instant;

/// A deadline timer's wait for an instance without a deadline.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How soon a failed attempt to time out a run is tried again.
const RETRY_TIME_OUT: Duration = Duration::from_millis(100);
use crate::{Error, Keiro, Result};

/// Runs the instance once in this process: `claimed` (a row this process
/// just created under its lease, `fresh`), or whatever this process can
/// claim now. Returns the row as the run left it (final,
/// suspended, or held elsewhere).
pub(crate) async fn run_here(
    keiro: &Keiro,
    run: RunFn,
    id: &str,
    claimed: Option<InstanceRow>,
) -> Result<InstanceRow> {
    keiro.ensure_executor().await?;
    let claimed = match claimed {
        Some(row) => Some(row),
        None => {
            let lease = Lease {
                owner: keiro.owner(),
                ttl_us: duration_us(keiro.lease_ttl()),
            };
            keiro.raw_store().claim(id, lease).await?
        }
    };
    if let Some(row) = claimed {
        if let Some(done) = execute(keiro, run, row, Stop::of(keiro), None, None).await? {
            return Ok(done);
        }
    }
    keiro
        .raw_store()
        .get_instance(id)
        .await?
        .ok_or_else(|| Error::NotFound { id: id.to_owned() })
}

/// One invocation: read the journal once (none when `row.fresh`), run the
/// body with its context, and record the end: `Ok(Some(row))` when it finished
/// or suspended, `Ok(None)` when the lease was lost to another executor.
///
/// A panic, or an error in the workflow's own data (an input or result that no
/// longer decodes), is a crash: counted against the instance's attempts, which
/// is retried later or, at the runtime's `max_attempts`, marked failed (returned as a
/// final row). A store error is transient: the lease is released and nothing
/// is counted. So is a clean shutdown (`stop`), which ends the run with
/// [`Error::Stopped`]. A run of a queued instance that returns hands its
/// queue slot over as `handing` says. A run that may start before its
/// instance is recorded gets the create it makes when it first needs it as
/// `deferred` (see `crate::context::deferred`), and `row` is the row that
/// create would make: `Ok(None)` also when another call recorded the id
/// first.
pub(crate) async fn execute(
    keiro: &Keiro,
    run: RunFn,
    row: InstanceRow,
    stop: Stop,
    mut handing: Option<&mut HandingOver>,
    deferred: Option<keiro_store::CreateRequest>,
) -> Result<Option<InstanceRow>> {
    let journal = if row.fresh {
        Vec::new()
    } else {
        // A read: safe to repeat through a passing fault (a pooled
        // connection the server dropped, a restart).
        let store = keiro.raw_store();
        let read = || store.load_journal(&row.id, row.generation);
        crate::retry::retrying((&row.name, &row.id), "reading its journal", read)
            .await
            .0?
    };
    // Claimed past its deadline (it was due then): end it, never run it.
    if row
        .deadline
        .is_some_and(|deadline| deadline <= keiro.now_us())
    {
        keiro.time_out(&row.id).await?;
        return Ok(keiro.raw_store().get_instance(&row.id).await?);
    }
    let (cx, aborted) = WorkflowContext::new(
        keiro.clone(),
        row.name.clone(),
        row.id.clone(),
        row.generation,
        journal,
    );
    if let Some(request) = deferred {
        cx.deferred.defer(request);
    }
    cx.set_deadline(row.deadline);
    // Registered until the end is recorded, so a cancellation meanwhile
    // finds the run.
    let _live = keiro.inflight().enter(&cx);
    let ttl = keiro.lease_ttl();
    // When the lease the run starts under was granted (or last renewed), as
    // this process's clock tells it from the expiry the row holds: a row
    // claimed ahead of a free slot waited under it meanwhile.
    let now = tokio::time::Instant::now();
    let granted = row.lease_expires_at.and_then(|expires| {
        let left = u64::try_from(expires.saturating_sub(keiro.now_us())).unwrap_or(0);
        (now + Duration::from_micros(left)).checked_sub(ttl)
    });
    let leased = granted.map_or(now, |at| at.min(now));
    cx.lease.renewed(leased);
    let ended = drive(keiro, run, &row, &cx, leased, aborted, stop).await;
    let renewed = cx.lease.finish().unwrap_or(leased);
    if let Some(handing) = handing.as_deref_mut() {
        // Its slot is still this run's to hand over only while its lease
        // holds: once lapsed, a claim may have counted the slot free.
        handing.lease_holds_until = Some(renewed + ttl.mul_f64(0.9));
    }
    if let Ended::TimedOut = ended {
        return Ok(keiro.raw_store().get_instance(&row.id).await?);
    }
    let (ended, steps) = durable_first(&cx, ended).await;
    // Lost to a row another run journaled first (not to a renewal): see
    // `end::release_overtaken`.
    // Or to another run that moved the instance on while this one was held
    // up, the lease renewed to this process: see `lapsed_lease`.
    if let Ended::LeaseLost = ended {
        if context::pipeline::lost_lease(&cx) || cx.lease.overtaken() {
            end::release_overtaken(keiro, &cx.name, &cx.id).await;
        }
    }
    // Still pending only for a run that returned: its end records it.
    let create = cx.deferred.take();
    end::record(keiro, row, ended, handing, create, steps).await
}

/// How a run that `ended` so may end once its instance is recorded (a run
/// that started before recording it: see `crate::context::deferred`) and
/// every step row it queued is durable: its end is observable, so it is
/// recorded only after them. A run that returned takes the rows still
/// queued instead, to commit with its end in one transaction (returned
/// beside it). A run whose queued rows could not be written ends as a store
/// error would end it (released, nothing counted), or as having lost its
/// lease.
async fn durable_first(cx: &WorkflowContext, ended: Ended) -> (Ended, Vec<(StepRow, StepTiming)>) {
    match ended {
        Ended::LeaseLost => {
            context::pipeline::abandon(cx);
            return (ended, Vec::new());
        }
        // A run that returned records its instance with its end; one stopped
        // before its instance was recorded leaves nothing to record.
        Ended::Returned(_) | Ended::Stopped => {}
        _ => match context::deferred::ensure(cx).await {
            Ok(()) => {}
            Err(Halt::Error(error)) => return (Ended::Aborted(error), Vec::new()),
            Err(_) => {
                context::pipeline::abandon(cx);
                return (Ended::LeaseLost, Vec::new());
            }
        },
    }
    let durable = match ended {
        Ended::Returned(_) => context::pipeline::take_rest(cx).await,
        _ => context::pipeline::settle(cx).await.map(|()| Vec::new()),
    };
    match durable {
        Ok(steps) => (ended, steps),
        Err(_) if context::pipeline::lost_lease(cx) => (Ended::LeaseLost, Vec::new()),
        Err(error) => (Ended::Aborted(error), Vec::new()),
    }
}

/// Runs the body of `row`'s workflow with context `cx` until it returns, halts
/// (`aborted`), is stopped or loses its lease, renewing the lease every third
/// of its `ttl` (keeping when the last renewal that held was sent in
/// `cx.lease`, which the executor heartbeat watches). A lease it could not
/// renew for two thirds of `ttl` (a renewal that failed) counts as lost:
/// the run stops before the lease may lapse.
/// A renewal that hangs is given until the lease lapses; the body goes on
/// meanwhile (it is polled beside the renewal). A run whose lease went
/// unrenewed that long (a hung renewal, or a task that went unpolled: a
/// hold-up) checks with the store that nothing moved under it before
/// polling its body again, and goes on if nothing did (see
/// `lapsed_lease`); a store that does not answer within one more TTL ends
/// it as having lost its lease. The body's future is dropped before this
/// returns.
async fn drive(
    keiro: &Keiro,
    run: RunFn,
    row: &InstanceRow,
    cx: &Arc<WorkflowContext>,
    leased: Instant,
    mut aborted: oneshot::Receiver<Halt>,
    mut stop: Stop,
) -> Ended {
    let ttl = keiro.lease_ttl();
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
    // Every run continues the trace of the span that started the instance.
    if let Some(traceparent) = &row.traceparent {
        crate::trace::adopt(&span, traceparent, &row.id);
    }
    let mut body = Box::pin(
        context::scope(
            Some(cx.clone()),
            AssertUnwindSafe(run(input)).catch_unwind(),
        )
        .instrument(span.clone()),
    );
    let mut renew = tokio::time::interval_at(leased + ttl / 3, ttl / 3);
    // When the last renewal that succeeded was sent (the claim, at first).
    let mut renewed = leased;
    // A renewal sent from inside a transactional step after the lease may
    // have lapsed kept the lease but proves too little (see
    // `lapsed_lease`): the check runs once the transaction has closed, and
    // steps wait for it meanwhile (`cx.lease` is left as it was).
    let mut check_due = false;
    let lease = Lease {
        owner: keiro.owner(),
        ttl_us: duration_us(ttl),
    };
    // The run is stopped at the instance's deadline, wherever its body is.
    let deadline = tokio::time::sleep(match row.deadline {
        Some(deadline) => until_us(deadline, keiro.now_us()),
        None => NEVER,
    });
    tokio::pin!(deadline);
    // The renewal and the time-out in flight, polled beside the body rather
    // than awaited instead of it: on SQLite a transactional step's body holds
    // the only write lock both need, and a body left unpolled never lets go
    // of it (the write would wait out the busy timeout, and the lease lapse).
    let mut renewing: Option<BoxFuture<'_, (Instant, Option<Result<bool>>)>> = None;
    let mut timing_out: Option<BoxFuture<'_, Result<bool>>> = None;
    loop {
        // This task went unpolled past the lease (a step body blocking its
        // thread, a starved runtime): the lease may have lapsed, and only the
        // store knows whether another executor took the instance meanwhile.
        // Ask it before the body goes on, leaving the body unpolled (no step
        // body starts on a lease that may be another's). A transactional
        // step holding its transaction open is left to its commit, which is
        // first-wins.
        let now = Instant::now();
        if must_check(cx, renewed + ttl <= now || check_due) {
            // It supersedes a renewal sent before the hold-up.
            renewing = None;
            // A deadline that passed during the hold-up ends the run before
            // its body is polled again (the select below would poll the body
            // first). A time-out begun before the hold-up may hold the
            // instance's row (the check below would wait on it): it ends
            // first too.
            if timing_out.is_none() && deadline.deadline() <= now {
                timing_out = Some(Box::pin(keiro.time_out(&row.id)));
            }
            if let Some(timing) = timing_out.take() {
                if let Ok(Ok(true)) = tokio::time::timeout(ttl, timing).await {
                    return Ended::TimedOut;
                }
                deadline.as_mut().reset(Instant::now() + RETRY_TIME_OUT);
            }
            // The body is not polled meanwhile, so no step starts on a
            // lease that may be another's; a step the body starts later
            // waits for this (see `LeaseWatch::unless_lapsed`).
            let Some(sent) = lapsed_lease::still_held(keiro, cx, lease, ttl, &span).await else {
                return Ended::LeaseLost;
            };
            renewed = sent;
            check_due = false;
            cx.lease.renewed(renewed);
            // Not the ticks missed during the hold-up, one after another.
            renew.reset();
        }
        // A task resumed after a hold-up polls the select below again, not
        // the check above: the branch before the body's sends it there.
        let (since, due) = (renewed, check_due);
        let held_up = std::future::poll_fn(move |_| {
            if must_check(cx, due || since + ttl <= Instant::now()) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        });
        tokio::select! {
            biased;
            halt = &mut aborted => {
                return match halt {
                    Ok(Halt::Error(error)) => Ended::Aborted(error),
                    Ok(Halt::Suspend { wake_at, awaiting, topic, waiting }) => {
                        Ended::Suspended(wake_at, awaiting, topic, waiting)
                    }
                    Ok(Halt::SuspendAny(wake)) => Ended::SuspendedOnAny(wake),
                    Ok(Halt::Cancelled) => Ended::Cancelled,
                    Ok(Halt::ContinueAsNew { input }) => Ended::ContinueAsNew(input),
                    Ok(Halt::LeaseLost) => Ended::LeaseLost,
                    Err(_) => Ended::Errored(Error::Internal(
                        "a workflow's context was dropped before the run ended".into(),
                    )),
                };
            }
            () = held_up => {}
            out = &mut body => {
                return match out {
                    Ok(Ok(output)) => returned(cx, output),
                    Ok(Err(error)) => Ended::Errored(error),
                    Err(panic) => {
                        let message = panic_message(panic.as_ref());
                        tracing::error!(parent: &span, %message, "keiro workflow panicked");
                        Ended::Panicked(message)
                    }
                };
            }
            _ = stop.wait() => return Ended::Stopped,
            _ = cx.transactions_closed(), if check_due && cx.in_transaction() => {}
            _ = &mut deadline, if timing_out.is_none() => {
                timing_out = Some(Box::pin(keiro.time_out(&row.id)));
            }
            () = cx.deadline_reached(), if timing_out.is_none() => {
                timing_out = Some(Box::pin(keiro.time_out(&row.id)));
            }
            timed = async { timing_out.as_mut().expect("guarded").await }, if timing_out.is_some() => {
                timing_out = None;
                match timed {
                    Ok(true) => return Ended::TimedOut,
                    // Ended by someone else meanwhile (it times out once).
                    Ok(false) => deadline.as_mut().reset(Instant::now() + RETRY_TIME_OUT),
                    Err(error) => {
                        tracing::warn!(parent: &span, %error, "keiro could not time out a workflow; retrying");
                        deadline.as_mut().reset(Instant::now() + RETRY_TIME_OUT);
                    }
                }
            }
            _ = renew.tick(), if renewing.is_none() => {
                // Not recorded yet: nobody else can take it, and recording it
                // leases it afresh.
                if cx.deferred.is_pending() {
                    renewed = tokio::time::Instant::now();
                    cx.lease.renewed(renewed);
                    continue;
                }
                let sent = tokio::time::Instant::now();
                if renewed + ttl <= sent && !cx.in_transaction() {
                    // Held up past the lease within this turn of the loop:
                    // confirmed at the top of the next.
                    continue;
                }
                let store = keiro.raw_store();
                // A renewal still unanswered when the lease lapses (by this
                // process's clock) has failed: the run stops there, wherever
                // the body is. Unless a transactional step holds its
                // transaction open: the renewal may wait for it (its row
                // commits first-wins).
                let budget = (!cx.in_transaction())
                    .then(|| (renewed + ttl).saturating_duration_since(sent));
                renewing = Some(Box::pin(async move {
                    let renewal = store.renew_lease(&row.id, lease);
                    let renewal = match budget {
                        Some(budget) => tokio::time::timeout(budget, renewal).await.ok(),
                        None => Some(renewal.await),
                    };
                    (sent, renewal.map(|r| r.map_err(Error::from)))
                }));
            }
            (sent, renewal) = async { renewing.as_mut().expect("guarded").await }, if renewing.is_some() => {
                renewing = None;
                let Some(renewal) = renewal else {
                    // Unanswered until the lease may lapse: a store that
                    // hangs, or this task held up with the renewal in
                    // flight. Either way the body goes on only once the
                    // store confirms the lease, within one more TTL (the
                    // check at the top of the loop).
                    tracing::warn!(parent: &span, "keiro's lease renewal went unanswered until the lease may lapse; the run goes on only once the store confirms its lease");
                    continue;
                };
                match renewal {
                    Ok(true) if renewed + ttl <= sent => {
                        // Sent after the lease may have lapsed (a
                        // transactional step held its transaction open past
                        // it): see `check_due`.
                        renewed = sent;
                        check_due = true;
                    }
                    Ok(true) => {
                        renewed = sent;
                        if !check_due {
                            cx.lease.renewed(renewed);
                        }
                    }
                    Ok(false) => return Ended::LeaseLost,
                    // The lease may lapse before the next renewal: another
                    // executor may claim the instance then, so this run must
                    // not go on journaling (or running steps) under it.
                    Err(error) if renewed.elapsed() + ttl / 3 >= ttl => {
                        tracing::warn!(parent: &span, %error, "keiro could not renew a lease before it may lapse; stopping the run (it resumes once the store is back)");
                        return Ended::LeaseLost;
                    }
                    Err(error) => tracing::warn!(parent: &span, %error, "keiro could not renew a lease; retrying"),
                }
            }
        }
    }
}

/// Whether a run whose lease may have `lapsed` (or whose check is due) asks
/// the store before its body is polled on: not while a transactional step
/// holds its transaction open (its commit is first-wins), nor before its
/// instance is recorded (nobody else can take it).
fn must_check(cx: &WorkflowContext, lapsed: bool) -> bool {
    lapsed && !cx.in_transaction() && !cx.deferred.is_pending()
}

/// A body that returned: its output, unless the journal records steps the
/// code never reached (non-determinism).
fn returned(cx: &WorkflowContext, output: crate::registry::WorkflowOutput) -> Ended {
    match cx.unreached() {
        Some(error) => Ended::Aborted(error),
        None => Ended::Returned(output),
    }
}
