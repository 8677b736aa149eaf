//! Reading what keiro stored: [`StoreView`], the read-only side of a
//! runtime's store, from [`crate::Keiro::store`] or [`crate::timers::Timers::store`].
//!
//! It reads instances, journals and executor identities, and hands out the
//! connection pool so an application can begin its own transaction for the
//! `*_tx` functions ([`crate::timers::schedule_tx`] and its siblings). It
//! changes nothing itself: every state change goes through keiro's own calls,
//! which keep its invariants. (Raw access for tests and tools is in
//! [`crate::unstable`].)

use keiro_store::Store;

use crate::Result;

pub use keiro_store::{ExecutorRow, InstanceRow, InstanceStatus, StepRow};

/// A read-only view of a store: instances, journals, executor identities.
///
/// ```no_run
/// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
/// if let Some(row) = keiro.store().get_instance("order-42").await? {
///     println!("order-42 is {} after {} crash(es)", row.status.as_str(), row.attempts);
///     for step in keiro.store().load_journal("order-42", row.generation).await? {
///         println!("  step {} `{}`", step.seq, step.name);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct StoreView<'a> {
    store: &'a Store,
}

impl<'a> StoreView<'a> {
    pub(crate) fn new(store: &'a Store) -> StoreView<'a> {
        StoreView { store }
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        self.store.backend()
    }

    /// The instance with this id, if any.
    pub async fn get_instance(&self, id: &str) -> Result<Option<InstanceRow>> {
        Ok(self.store.get_instance(id).await?)
    }

    /// The journal of one generation of an instance, in step order.
    pub async fn load_journal(&self, id: &str, generation: i64) -> Result<Vec<StepRow>> {
        Ok(self.store.load_journal(id, generation).await?)
    }

    /// One journaled step, if recorded.
    pub async fn get_step(&self, id: &str, generation: i64, seq: i64) -> Result<Option<StepRow>> {
        Ok(self.store.get_step(id, generation, seq).await?)
    }

    /// The executor identity row with this id, if any process holds it.
    pub async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRow>> {
        Ok(self.store.get_executor(id).await?)
    }

    /// The SQLite pool, on SQLite: to begin a transaction of your own for the
    /// `*_tx` functions (`pool.begin_with("BEGIN IMMEDIATE")`).
    #[cfg(feature = "sqlite")]
    pub fn sqlite_pool(&self) -> Option<&'a sqlx::SqlitePool> {
        #[allow(unreachable_patterns)]
        match self.store {
            Store::Sqlite(store) => Some(store.pool()),
            _ => None,
        }
    }

    /// The PostgreSQL pool, on PostgreSQL: to begin a transaction of your own
    /// for the `*_tx` functions.
    #[cfg(feature = "postgres")]
    pub fn postgres_pool(&self) -> Option<&'a sqlx::PgPool> {
        #[allow(unreachable_patterns)]
        match self.store {
            Store::Postgres(store) => Some(store.pool()),
            _ => None,
        }
    }

    /// Closes the connection pool, waiting for connections in use to return.
    /// The runtime (and every clone of it) cannot use the store afterwards.
    pub async fn close(&self) {
        self.store.close().await
    }
}
