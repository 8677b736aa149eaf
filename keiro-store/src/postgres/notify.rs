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

    /// Whether this store can `LISTEN`: not behind a transaction-pooling
    /// proxy without [`crate::StoreOptions::listen_url`] (a notification
    /// would reach a server connection the client no longer holds).
    pub fn can_listen(&self) -> bool {
        self.listen_url.is_some() || !self.pooled
    }

    async fn listen(&self, op: &'static str, channel: &str) -> Result<sqlx::postgres::PgListener> {
        let listener = match &self.listen_url {
            // A pool of its own on the direct server: the listener keeps
            // one of its connections for as long as it lives.
            Some(direct) => {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect_lazy_with((**direct).clone());
                sqlx::postgres::PgListener::connect_with(&pool).await
            }
            None if self.pooled => Err(sqlx::Error::Configuration(
                "LISTEN cannot work through a transaction-pooling proxy: set \
                 StoreOptions::listen_url to a direct URL for push wakes (workers poll \
                 without it)"
                    .into(),
            )),
            None => sqlx::postgres::PgListener::connect_with(self.pool()).await,
        };
        let mut listener = listener.map_err(StoreError::query(op))?;
        listener
            .listen(channel)
            .await
            .map_err(StoreError::query(op))?;
        Ok(listener)
    }

    /// Notifies `keiro_wake` with [`crate::wake_payload`]`(id)`: bounded, so
    /// a long id never makes the notification fail.
    pub(crate) async fn wake_workers(&self, id: &str) -> Result<()> {
        crate::prepared::query("SELECT pg_notify($1, $2)")
            .bind(WAKE_CHANNEL)
            .bind(crate::wake_payload(id).as_ref())
            .execute(self.exec())
            .await
            .map_err(StoreError::query("wake_workers"))?;
        Ok(())
    }
}
