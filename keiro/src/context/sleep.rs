//! Durable sleep: the deadline is journaled the first time, so a replay (after
//! a crash, a redeploy or a suspension) wakes at the original deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro_store::now_ms;

use super::{claim_seq, run_step, Halt, StepKind, WorkflowContext};

/// Waits for `duration`. Inside a workflow the deadline is journaled when the
/// sleep first runs; a replay waits only for what is left of it. A wait longer
/// than the runtime's `suspend_after` suspends the workflow: its future is
/// dropped, its lease released, and it costs only its row until due. Outside
/// a workflow it is `tokio::time::sleep`.
pub fn sleep(duration: Duration) -> impl Future<Output = ()> + Send {
    let slot = claim_seq();
    async move {
        match slot {
            None => tokio::time::sleep(duration).await,
            Some((cx, seq)) => {
                let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
                let deadline = async move { now_ms().saturating_add(millis) };
                let deadline: i64 =
                    run_step(cx.clone(), seq, StepKind::Sleep, "sleep", deadline).await;
                wait_until(&cx, deadline).await;
            }
        }
    }
}

/// Waits until `when`. Inside a workflow the deadline is journaled, and a wait
/// longer than the runtime's `suspend_after` suspends the workflow (see
/// [`sleep`]). Outside a workflow it is `tokio::time::sleep` until then.
pub fn sleep_until(when: SystemTime) -> impl Future<Output = ()> + Send {
    let slot = claim_seq();
    async move {
        match slot {
            None => {
                let left = when.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::sleep(left).await
            }
            Some((cx, seq)) => {
                let millis = when
                    .duration_since(UNIX_EPOCH)
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                    .unwrap_or(0);
                let deadline: i64 = run_step(
                    cx.clone(),
                    seq,
                    StepKind::Sleep,
                    "sleep",
                    async move { millis },
                )
                .await;
                wait_until(&cx, deadline).await;
            }
        }
    }
}

async fn wait_until(cx: &Arc<WorkflowContext>, deadline: i64) {
    let left = deadline - now_ms();
    if left <= 0 {
        return;
    }
    let left = Duration::from_millis(left as u64);
    if left > cx.suspend_after {
        cx.halt(Halt::Suspend {
            wake_at: Some(deadline),
            awaiting: None,
        });
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(left).await;
}
