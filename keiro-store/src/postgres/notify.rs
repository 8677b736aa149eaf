//! `LISTEN`/`NOTIFY`: how PostgreSQL wakes resume and timer workers in other
//! processes. A lost notification costs latency (workers still poll), never
//! work.

use super::PostgresStore;
use crate::{Result, StoreError};

/// The channel resume workers listen on.
pub(crate) const WAKE_CHANNEL: &str = "keiro_wake";

/// The channel every timer schedule notifies (in the statement that writes
/// the timer, see [`crate::sql::Dialect::timer_channel`]).
pub(super) const TIMER_CHANNEL: &str = "keiro_timers";

impl PostgresStore {
    /// A listener on the `keiro_wake` channel, on which enqueues and other
    /// wake sources notify resume workers.
    pub async fn listen_wakes(&self) -> Result<sqlx::postgres::PgListener> {
        self.listen("listen_wakes", WAKE_CHANNEL).await
    }

    /// A listener on the channel every timer schedule notifies: a sleeping
    /// timer worker wakes on it to re-check the earliest fire time.
    pub async fn listen_timers(&self) -> Result<sqlx::postgres::PgListener> {
        self.listen("listen_timers", TIMER_CHANNEL).await
    }

    async fn listen(&self, op: &'static str, channel: &str) -> Result<sqlx::postgres::PgListener> {
        let mut listener = sqlx::postgres::PgListener::connect_with(self.pool())
            .await
            .map_err(StoreError::query(op))?;
        listener
            .listen(channel)
            .await
            .map_err(StoreError::query(op))?;
        Ok(listener)
    }

    /// Notifies `keiro_wake` with [`crate::wake_payload`]`(id)`: bounded, so
    /// a long id never makes the notification fail.
    pub(crate) async fn wake_workers(&self, id: &str) -> Result<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WAKE_CHANNEL)
            .bind(crate::wake_payload(id).as_ref())
            .execute(self.pool())
            .await
            .map_err(StoreError::query("wake_workers"))?;
        Ok(())
    }
}
