//! The open, empty transaction a transactional step leaves behind, kept for
//! the next one.
//!
//! A transactional step commits with one batch `… INSERT …; COMMIT; BEGIN`
//! (see `StepTx::journal_and_commit`), so its connection comes back already
//! inside a new transaction that has run nothing. Kept here, the next
//! transactional step starts in it at once, saving the pool's checkout and
//! the returning connection's `ROLLBACK`:
//! - PostgreSQL: the next step needs no `BEGIN` of its own, so a workflow
//!   of consecutive transactional steps costs two round trips per step (the
//!   application's statement, and the journal row with the commit). An
//!   empty transaction holds no lock and no snapshot (PostgreSQL takes the
//!   snapshot at its first statement, so `SET TRANSACTION ISOLATION LEVEL`
//!   in the body still applies). `now()` in a step's body is the start of
//!   its transaction, so it may read up to [`WARM_FOR`] before the step
//!   began; `clock_timestamp()` is the moment of the statement.
//! - SQLite: the next step turns the empty deferred transaction into its
//!   own with one prepared batch (`ROLLBACK; … BEGIN IMMEDIATE; …`, see
//!   `step_tx::REBEGIN_SQLITE`) instead of a checkout and a `BEGIN` parsed
//!   anew, and the connection it leaves pays no `ROLLBACK` and no check on
//!   its way back to the pool. A deferred `BEGIN` that has run nothing holds
//!   no lock and no read snapshot, so writers and checkpoints do not wait
//!   for it.
//!
//! It is kept at most [`WARM_FOR`] (less than the idle time after which the
//! PostgreSQL pool pings a connection before handing it out), and then
//! rolled back and returned to the pool. Not used behind a PostgreSQL
//! transaction-pooling proxy (an open transaction pins a server connection
//! there), with several PostgreSQL hosts (the pool's check that a connection
//! does not belong to a host it left is made at checkout), nor on a pool of
//! one connection (on SQLite an in-memory database), which it would hold
//! from everyone else.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::{Database, Pool, Transaction};

/// How long an empty transaction is kept for the next transactional step.
const WARM_FOR: Duration = Duration::from_millis(50);

/// At most one kept transaction, and the task that will return it.
#[derive(Debug)]
pub(crate) struct WarmTx<DB: Database> {
    state: Mutex<State<DB>>,
}

impl<DB: Database> Default for WarmTx<DB> {
    fn default() -> Self {
        WarmTx {
            state: Mutex::new(State {
                kept: None,
                reaper: None,
            }),
        }
    }
}

#[derive(Debug)]
struct State<DB: Database> {
    /// The kept transaction and when it was kept.
    kept: Option<(Instant, Transaction<'static, DB>)>,
    /// The task that returns an expired one to the pool: it clears this as
    /// it ends, or it ended with the runtime that spawned it.
    reaper: Option<tokio::task::JoinHandle<()>>,
}

impl<DB: Database> WarmTx<DB> {
    /// The kept transaction, if one is kept and `pool`, the pool it came
    /// from, is open: one kept while the pool closed is dropped, which
    /// returns it.
    pub(crate) fn take(&self, pool: &Pool<DB>) -> Option<Transaction<'static, DB>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let kept = state.kept.take().map(|(_, tx)| tx);
        drop(state);
        kept.filter(|_| !pool.is_closed())
    }

    /// Keeps `tx` (open and empty) for the next transactional step; one kept
    /// before is returned to the pool. Outside a Tokio runtime, or once
    /// `pool` (the pool `tx` came from) is closing, whose `close` waits for
    /// every connection, `tx` is dropped (rolled back) at once.
    pub(crate) fn keep(self: &Arc<Self>, pool: &Pool<DB>, tx: Transaction<'static, DB>) {
        if pool.is_closed() {
            return;
        }
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
async fn reap<DB: Database>(warm: Weak<WarmTx<DB>>) {
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

impl<DB: Database> Drop for WarmTx<DB> {
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
