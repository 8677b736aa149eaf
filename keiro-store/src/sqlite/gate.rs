//! The write gate: one async mutex per SQLite database file, shared by every
//! store of this process on that file, which each write transaction holds
//! from before its `BEGIN IMMEDIATE` to its end.
//!
//! SQLite lets one connection write at a time. A connection that finds the
//! write lock taken does not wait for its release: its busy handler sleeps
//! and tries again, 1 ms, then 2, 5, 10 … up to 100 ms, so a writer that
//! comes a microsecond too late waits at least a millisecond, several
//! commits' time. Writers of this process instead queue on the gate and each
//! is woken the moment the one before it ends. (Writers of other processes
//! still meet the busy handler; the gate changes nothing about what SQLite
//! allows, only how this process's writers wait their turn.)
//!
//! Lone write statements (a lease renewal, a claim, a lone step row) take
//! their turn too, for the length of the statement. A writer that waited
//! [`MOST_WAIT`] for its turn goes on without it and meets SQLite's own
//! busy handler, as it would without the gate: a writer holding the gate
//! while it awaits another writer of this process (which SQLite would
//! refuse after its busy timeout anyway) then fails as it did before,
//! instead of waiting forever. A transactional step's transaction, whose
//! body is the application's code, does not take the gate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::{Sqlite, SqliteConnection, Transaction};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The gate of one database file.
#[derive(Debug, Clone)]
pub(crate) struct WriteGate(Arc<AsyncMutex<()>>);

/// The gates of this process, by canonical file path; an entry lives while
/// a store holds its gate.
static GATES: Mutex<Option<HashMap<PathBuf, Weak<AsyncMutex<()>>>>> = Mutex::new(None);

impl WriteGate {
    /// The gate of the database file at `path` (a gate of its own for an
    /// in-memory database, or a path that does not resolve).
    pub(crate) fn of(path: Option<PathBuf>) -> WriteGate {
        let Some(path) = path.and_then(|p| std::fs::canonicalize(p).ok()) else {
            return WriteGate(Arc::new(AsyncMutex::new(())));
        };
        let mut gates = GATES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let gates = gates.get_or_insert_with(HashMap::new);
        gates.retain(|_, gate| gate.strong_count() > 0);
        if let Some(gate) = gates.get(&path).and_then(Weak::upgrade) {
            return WriteGate(gate);
        }
        let gate = Arc::new(AsyncMutex::new(()));
        gates.insert(path, Arc::downgrade(&gate));
        WriteGate(gate)
    }

    /// Waits for this process's turn to write: `None` when it did not come
    /// within [`MOST_WAIT`] (the writer then goes on without it).
    pub(crate) async fn enter(&self) -> Option<OwnedMutexGuard<()>> {
        tokio::time::timeout(MOST_WAIT, self.0.clone().lock_owned())
            .await
            .ok()
    }
}

/// The longest a writer waits for its turn before it goes on without it.
const MOST_WAIT: Duration = Duration::from_secs(5);

/// A write transaction holding the gate until it ends (committed, rolled
/// back or dropped).
#[derive(Debug)]
pub(crate) struct GatedTx {
    // Declared first, so a dropped transaction queues its rollback before
    // the gate opens.
    tx: Transaction<'static, Sqlite>,
    _turn: Option<OwnedMutexGuard<()>>,
}

impl GatedTx {
    /// `tx`, begun while holding `turn`.
    pub(crate) fn new(
        tx: Transaction<'static, Sqlite>,
        turn: Option<OwnedMutexGuard<()>>,
    ) -> GatedTx {
        GatedTx { tx, _turn: turn }
    }

    /// Commits, then opens the gate.
    pub(crate) async fn commit(self) -> std::result::Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    /// Rolls back, then opens the gate.
    pub(crate) async fn rollback(self) -> std::result::Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}

impl std::ops::Deref for GatedTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for GatedTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl crate::query::RollBack for GatedTx {
    fn roll_back(self) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send {
        self.rollback()
    }
}

#[cfg(test)]
mod tests {
    use super::WriteGate;
    use std::sync::Arc;

    #[test]
    fn stores_of_one_file_share_its_gate() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
        std::fs::write(&a, b"").unwrap();
        std::fs::write(&b, b"").unwrap();
        let first = WriteGate::of(Some(a.clone()));
        // Another spelling of the same file.
        let again = WriteGate::of(Some(dir.path().join(".").join("a.db")));
        assert!(Arc::ptr_eq(&first.0, &again.0), "one file, one gate");
        let other = WriteGate::of(Some(b));
        assert!(
            !Arc::ptr_eq(&first.0, &other.0),
            "another file, another gate"
        );
        let (m1, m2) = (WriteGate::of(None), WriteGate::of(None));
        assert!(
            !Arc::ptr_eq(&m1.0, &m2.0),
            "each in-memory database its own"
        );
        // Once no store holds it, the file's next store gets a new gate.
        let weak = Arc::downgrade(&first.0);
        drop((first, again));
        assert!(weak.upgrade().is_none());
        let later = WriteGate::of(Some(a));
        assert_eq!(Arc::strong_count(&later.0), 1);
    }

    #[tokio::test]
    async fn a_turn_is_held_until_dropped() {
        let gate = WriteGate::of(None);
        let turn = gate.enter().await.expect("a free gate");
        assert!(gate.0.try_lock().is_err(), "held while the turn lives");
        drop(turn);
        assert!(gate.0.try_lock().is_ok(), "free once it is dropped");
    }
}
