//! What a run does when its task went unpolled past its lease (a step body
//! blocking its thread, a starved runtime, a paused process): the lease may
//! have lapsed, and another executor may have taken the instance meanwhile.
//! Before its body goes on, the run renews the lease and checks that nothing
//! moved under it; if anything did, or the store does not answer, it stops
//! (it resumes from its journal wherever the instance runs next).

use std::time::Duration;

use keiro_store::Lease;
use tokio::time::Instant;

use crate::context::WorkflowContext;
use crate::{Keiro, Result};

/// What the store says of a run held up past its lease.
enum Verdict {
    /// Nothing moved: the lease, renewed when this instant was sent, is
    /// the run's.
    Held(Instant),
    /// The lease is not the run's (taken, or the instance ended).
    Lost(&'static str),
    /// The lease is renewed to this process, but another run moved the
    /// instance on meanwhile: this run must not go on, and the lease is
    /// let go so that a run from the journal can start at once.
    Overtaken(&'static str),
}

/// When the run of `cx` may go on under `lease` after it went unrenewed
/// past its TTL (a hold-up, or a renewal left unanswered; the lease renewed
/// then), asked of the store within `wait`; `None`, and why in a warning,
/// when it may not.
pub(super) async fn still_held(
    keiro: &Keiro,
    cx: &WorkflowContext,
    lease: Lease<'_>,
    wait: Duration,
    span: &tracing::Span,
) -> Option<Instant> {
    match tokio::time::timeout(wait, moved_under(keiro, cx, lease)).await {
        Ok(Ok(Verdict::Held(sent))) => {
            tracing::info!(parent: span, "keiro: this run's lease went unrenewed past its TTL (its task held up, or its renewal unanswered), and nobody took it meanwhile; it goes on");
            Some(sent)
        }
        Ok(Ok(Verdict::Lost(why))) => {
            tracing::warn!(parent: span, "keiro: this run's lease went unrenewed past its TTL and {why}; stopping the run");
            None
        }
        Ok(Ok(Verdict::Overtaken(why))) => {
            tracing::warn!(parent: span, "keiro: this run's lease went unrenewed past its TTL and {why}; stopping the run (the instance resumes from its journal)");
            cx.lease.set_overtaken();
            None
        }
        Ok(Err(error)) => {
            tracing::warn!(parent: span, %error, "keiro: this run's lease went unrenewed past its TTL and the store could not confirm it; stopping the run (it resumes once the store is back)");
            None
        }
        Err(_) => {
            tracing::warn!(parent: span, "keiro: this run's lease went unrenewed past its TTL and the store did not confirm it in time; stopping the run (it resumes once the store answers)");
            None
        }
    }
}

/// Renews the lease, then says what moved under the run meanwhile, if
/// anything did. An instance of a named queue whose lease lapsed is not
/// renewed (see `Store::renew_lease`): a claim may have counted its slot
/// free and filled it, so the run stops and the instance queues for a slot
/// again. A renewal alone proves too little: a lease is its owner's
/// name, and this process's own resume worker may have claimed the instance
/// back after another executor ran it further and let go of it (a
/// suspension, a release); a process that took over this one's identity
/// claims under the same name. Once renewed, the lease is this run's for a
/// TTL, so what is read after the renewal stays true while the run goes on.
/// The journal's rows the run did not load are taken into its journal: a
/// step it allocated but did not start yet (a `join!`'s) then replays the
/// row another run wrote instead of running again.
async fn moved_under(keiro: &Keiro, cx: &WorkflowContext, lease: Lease<'_>) -> Result<Verdict> {
    // A pipelined run's rows still queued go first: one another run
    // journaled differently meanwhile means the run went on from a value
    // the journal does not hold.
    if crate::context::pipeline::settle(cx).await.is_err() {
        if crate::context::pipeline::lost_lease(cx) {
            return Ok(Verdict::Overtaken(
                "another executor journaled one of its steps differently meanwhile",
            ));
        }
        return Ok(Verdict::Lost("its journal writes failed meanwhile"));
    }
    let store = keiro.raw_store();
    let sent = Instant::now();
    if !store.renew_lease(&cx.id, lease).await? {
        return Ok(Verdict::Lost(
            "another executor took the instance meanwhile, or it ended, or (on a named queue) \
             its lease lapsed and a claim may have given its slot to another instance",
        ));
    }
    if let Some(token) = keiro.executor_token() {
        let ours = store
            .get_executor(lease.owner)
            .await?
            .is_some_and(|row| row.token == token);
        if !ours {
            // The lease's name is that process's now: nothing to let go of.
            return Ok(Verdict::Lost(
                "another process took over this process's executor identity meanwhile",
            ));
        }
    }
    let generation = store.get_instance(&cx.id).await?.map(|row| row.generation);
    if generation != Some(cx.generation) {
        return Ok(Verdict::Overtaken(
            "the instance was continued as new meanwhile",
        ));
    }
    let frontier = cx.known_frontier();
    let journal = store.load_journal(&cx.id, cx.generation).await?;
    if journal.iter().any(|step| step.seq >= frontier) {
        return Ok(Verdict::Overtaken(
            "another executor ran the instance further meanwhile",
        ));
    }
    cx.adopt(journal);
    Ok(Verdict::Held(sent))
}
