//! Journaled values: the clock and random ids a replay must see unchanged.

use std::future::Future;
use std::time::SystemTime;

use super::{claim_seq, run_step, StepKind};

/// The current time. Inside a workflow it is the runtime's clock (virtual in
/// a [`crate::testing::TestEnv`]), journaled, so a replay sees the first
/// run's value; outside it is [`SystemTime::now`]. Like a step, its id is
/// allocated when it is called.
pub fn now() -> impl Future<Output = SystemTime> + Send {
    let slot = claim_seq();
    async move {
        match slot {
            None => SystemTime::now(),
            Some((cx, seq)) => {
                let clock = cx.keiro.clock().clone();
                run_step(cx, seq, StepKind::Now, "now", async move { clock.now() }).await
            }
        }
    }
}

/// A random (v4) UUID. Inside a workflow it is journaled, so a replay sees the
/// first run's value; outside it is a fresh one.
pub fn uuid() -> impl Future<Output = uuid::Uuid> + Send {
    let slot = claim_seq();
    async move {
        match slot {
            None => uuid::Uuid::new_v4(),
            Some((cx, seq)) => {
                run_step(cx, seq, StepKind::Uuid, "uuid", async {
                    uuid::Uuid::new_v4()
                })
                .await
            }
        }
    }
}
