//! What a run does when its task went unpolled past its lease (a step body
//! blocking its thread, a starved runtime, a paused process): the lease may
//! have lapsed, and another executor may have taken the instance meanwhile.
//! Before its body goes on, the run renews the lease and checks that nothing
//! moved under it; if anything did, or the store does not answer, it stops
//! (it resumes from its journal wherever the instance runs next).

use std::time::Duration;

use keiro_store::Lease;

use crate::context::WorkflowContext;
use crate::Keiro;

/// Whether the run of `cx` may go on under `lease` after a hold-up past it,
/// asked of the store within `wait`; says why not in a warning.
pub(super) async fn still_held(
    keiro: &Keiro,
    cx: &WorkflowContext,
    lease: Lease<'_>,
    wait: Duration,
    span: &tracing::Span,
) -> bool {
    match tokio::time::timeout(wait, moved_under(keiro, cx, lease)).await {
        Ok(Ok(None)) => {
            tracing::info!(parent: span, "keiro: this run went unpolled past its lease, which nobody took meanwhile; it goes on");
            true
        }
        Ok(Ok(Some(why))) => {
            tracing::warn!(parent: span, "keiro: this run went unpolled past its lease and {why}; stopping the run");
            false
        }
        Ok(Err(error)) => {
            tracing::warn!(parent: span, %error, "keiro: this run went unpolled past its lease and the store could not confirm it; stopping the run (it resumes once the store is back)");
            false
        }
        Err(_) => {
            tracing::warn!(parent: span, "keiro: this run went unpolled past its lease and the store did not confirm it in time; stopping the run (it resumes once the store answers)");
            false
        }
    }
}

/// Renews the lease, then says what moved under the run meanwhile, if
/// anything did. A renewal alone proves too little: a lease is its owner's
/// name, and this process's own resume worker may have claimed the instance
/// back after another executor ran it further and let go of it (a
/// suspension, a release); a process that took over this one's identity
/// claims under the same name. Once renewed, the lease is this run's for a
/// TTL, so what is read after the renewal stays true while the run goes on.
async fn moved_under(
    keiro: &Keiro,
    cx: &WorkflowContext,
    lease: Lease<'_>,
) -> keiro_store::Result<Option<&'static str>> {
    let store = keiro.raw_store();
    if !store.renew_lease(&cx.id, lease).await? {
        return Ok(Some(
            "another executor took the instance meanwhile (or it ended)",
        ));
    }
    if let Some(token) = keiro.executor_token() {
        let ours = store
            .get_executor(lease.owner)
            .await?
            .is_some_and(|row| row.token == token);
        if !ours {
            return Ok(Some(
                "another process took over this process's executor identity meanwhile",
            ));
        }
    }
    let generation = store.get_instance(&cx.id).await?.map(|row| row.generation);
    if generation != Some(cx.generation) {
        return Ok(Some("the instance was continued as new meanwhile"));
    }
    let frontier = cx.known_frontier();
    let journal = store.load_journal(&cx.id, cx.generation).await?;
    if journal.iter().any(|step| step.seq >= frontier) {
        return Ok(Some("another executor ran the instance further meanwhile"));
    }
    Ok(None)
}
