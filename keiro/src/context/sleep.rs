//! Durable sleep: the deadline is journaled the first time, so a replay (after
//! a crash, a redeploy or a suspension) wakes at the original deadline.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use keiro_store::WaitingStep;

use super::{claim_seq, record, DurableFuture, Halt, StepKind, WorkflowContext};
use crate::time::to_us;

/// Waits for `duration`. Inside a workflow the deadline is journaled when the
/// sleep first runs; a replay waits only for what is left of it. A wait longer
/// than the runtime's `suspend_after` suspends the workflow: its future is
/// dropped, its lease released, and it costs only its row until due. Outside
/// a workflow it is `tokio::time::sleep`.
///
/// ```no_run
/// use std::time::Duration;
///
/// #[keiro::step]
/// async fn send_reminder(to: String) -> Result<(), String> {
///     Ok(())
/// }
///
/// #[keiro::workflow]
/// async fn trial(user: String) -> Result<(), String> {
///     // Survives restarts: after a crash the workflow wakes at the first deadline.
///     keiro::sleep(Duration::from_secs(14 * 24 * 3600)).await;
///     send_reminder(user).await
/// }
/// ```
pub fn sleep(duration: Duration) -> DurableFuture<()> {
    let slot = claim_seq();
    let deadline = slot
        .as_ref()
        .map(|(cx, _)| cx.keiro.clock().now() + duration);
    DurableFuture::new(async move {
        match (slot, deadline) {
            (Some((cx, seq)), Some(deadline)) => durable_wait(cx, seq, deadline).await,
            _ => tokio::time::sleep(duration).await,
        }
    })
}

/// Waits until `when`. Inside a workflow the deadline is journaled, and a wait
/// longer than the runtime's `suspend_after` suspends the workflow (see
/// [`sleep`]). Outside a workflow it is `tokio::time::sleep` until then.
pub fn sleep_until(when: SystemTime) -> DurableFuture<()> {
    let slot = claim_seq();
    DurableFuture::new(async move {
        match slot {
            None => {
                let left = when.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::sleep(left).await
            }
            Some((cx, seq)) => durable_wait(cx, seq, when).await,
        }
    })
}

/// How long until `deadline` (µs since the epoch, by the runtime's clock), as
/// a monotonic instant.
fn instant_of(cx: &WorkflowContext, deadline: i64) -> Instant {
    let left = deadline - cx.keiro.now_us();
    Instant::now() + Duration::from_micros(left.max(0) as u64)
}

async fn durable_wait(cx: Arc<WorkflowContext>, seq: i64, deadline: SystemTime) {
    let name = "sleep";
    let kind = StepKind::Sleep;
    if let Some(recorded) = cx.recorded(seq) {
        let deadline: i64 = super::step::replay(&cx, seq, kind, name, &recorded).await;
        return wait_until(&cx, seq, name, deadline).await;
    }
    let deadline = to_us(deadline);
    let target = instant_of(&cx, deadline);
    if target.saturating_duration_since(Instant::now()) > cx.suspend_after {
        // Suspending needs the deadline durable first: the resumed run waits
        // for the recorded one.
        let recorded = record(&cx, seq, kind, name, deadline).await;
        return wait_until(&cx, seq, name, recorded).await;
    }
    // A short wait overlaps its journal write: the step is durable before the
    // sleep returns, and costs no time of its own.
    let (recorded, ()) = tokio::join!(record(&cx, seq, kind, name, deadline), sleep_to(target));
    if recorded != deadline {
        // Another executor recorded this sleep first: its deadline stands.
        wait_until(&cx, seq, name, recorded).await;
    }
}

/// Waits until `deadline`, the one recorded by sleep step `seq` (named
/// `name`), suspending the run when it is further than `suspend_after`.
pub(super) async fn wait_until(cx: &Arc<WorkflowContext>, seq: i64, name: &str, deadline: i64) {
    let target = instant_of(cx, deadline);
    let left = target.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return;
    }
    if left > cx.suspend_after {
        // The journal and the row share one unit: the deadline is the wake time.
        let suspend = Halt::Suspend {
            wake_at: Some(deadline),
            awaiting: None,
            topic: None,
            waiting: Some(WaitingStep {
                seq,
                kind: "sleep".to_owned(),
                name: name.to_owned(),
            }),
        };
        // In a select's branch the wish is filed and the sleep goes on in
        // memory, until the select suspends the run or another branch wins.
        if let Some(suspend) = super::select::intercept(suspend) {
            cx.halt(suspend);
            std::future::pending::<()>().await;
        }
    }
    sleep_to(target).await;
}

/// Sleeps until `target`. tokio's timer rounds a deadline up to its next
/// millisecond tick, so it is asked for one tick early and the rest (under a
/// millisecond) is waited by yielding, so sequential durable sleeps do not
/// drift a millisecond each.
async fn sleep_to(target: Instant) {
    let tick = Duration::from_millis(1);
    if let Some(early) = target.checked_sub(tick) {
        if early > Instant::now() {
            tokio::time::sleep_until(early.into()).await;
        }
    }
    while Instant::now() < target {
        tokio::task::yield_now().await;
    }
}
