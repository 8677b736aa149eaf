//! The open, empty transaction a transactional step leaves behind, kept for
//! the next one.
//!
//! A transactional step commits with one simple query `INSERT …; COMMIT;
//! BEGIN` (see `StepTx::journal_and_commit`), so its connection comes back
//! already inside a new transaction that has run nothing. Kept here, the next
//! transactional step starts in it at once instead of paying a round trip for
//! its own `BEGIN` (and the returning connection its `ROLLBACK`). A workflow
//! of consecutive transactional steps then costs two round trips per step:
//! the application's statement and the journal row with the commit.
//!
//! An empty transaction holds no lock and no snapshot (PostgreSQL takes the
//! snapshot at its first statement, so `SET TRANSACTION ISOLATION LEVEL` in
//! the body still applies). It is kept at most [`WARM_FOR`], less than the
//! idle time after which the pool pings a connection before handing it out,
//! and then rolled back and returned to the pool. `now()` in a step's body is
//! the start of its transaction, so it may read up to [`WARM_FOR`] before the
//! step began; `clock_timestamp()` is the moment of the statement.
//!
//! Not used behind a transaction-pooling proxy (an open transaction pins a
//! server connection there) nor with several hosts (the pool's check that a
//! connection does not belong to a host it left is made at checkout).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::{Postgres, Transaction};

/// How long an empty transaction is kept for the next transactional step.
const WARM_FOR: Duration = Duration::from_millis(50);

/// At most one kept transaction, and the task that will return it.
#[derive(Debug, Default)]
pub(crate) struct WarmTx {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The kept transaction and when it was kept.
    kept: Option<(Instant, Transaction<'static, Postgres>)>,
    /// The task that returns an expired one to the pool: it clears this as
    /// it ends, or it ended with the runtime that spawned it.
    reaper: Option<tokio::task::JoinHandle<()>>,
}

impl WarmTx {
    /// The kept transaction, if one is kept.
    pub(crate) fn take(&self) -> Option<Transaction<'static, Postgres>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.kept.take().map(|(_, tx)| tx)
    }

    /// Keeps `tx` (open and empty) for the next transactional step; one kept
    /// before is returned to the pool. Outside a Tokio runtime `tx` is
    /// dropped (rolled back) at once.
    pub(crate) fn keep(self: &Arc<Self>, tx: Transaction<'static, Postgres>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let replaced = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let replaced = state.kept.replace((Instant::now(), tx));
            if state.reaper.as_ref().is_none_or(|task| task.is_finished()) {
                state.reaper = Some(runtime.spawn(reap(Arc::downgrade(self))));
            }
            replaced
        };
        // Dropped outside the lock: its rollback is queued on its connection.
        drop(replaced);
    }
}

/// Returns the kept transaction to the pool once it has been kept
/// [`WARM_FOR`]; ends when none is kept (the next `keep` starts another).
async fn reap(warm: Weak<WarmTx>) {
    loop {
        let Some(warm) = warm.upgrade() else { return };
        let wake_at = {
            let mut state = warm.state.lock().unwrap_or_else(|e| e.into_inner());
            match &state.kept {
                None => {
                    state.reaper = None;
                    return;
                }
                Some((at, _)) if at.elapsed() >= WARM_FOR => {
                    let expired = state.kept.take();
                    state.reaper = None;
                    drop(state);
                    drop(expired);
                    return;
                }
                Some((at, _)) => *at + WARM_FOR,
            }
        };
        drop(warm);
        tokio::time::sleep_until(wake_at.into()).await;
    }
}

impl Drop for WarmTx {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some((_, tx)) = state.kept.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                drop(tx);
            } else {
                // Returning a connection to its pool needs a runtime; with
                // none left the process is ending, and so is the pool.
                std::mem::forget(tx);
            }
        }
    }
}
