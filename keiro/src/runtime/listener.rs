//! Wake-ups per database, shared by everything in this process that uses it:
//! workflow waiters and resume workers (channel `keiro_wake`, whose payload
//! is the [`keiro_store::wake_payload`] of the instance id a step was recorded
//! for: the id, or a digest of a long one; or empty) and timer worker
//! loops (channel `keiro_timers`).
//!
//! Schedules and recordings in this process wake their waiters directly. On
//! PostgreSQL one listener connection per database and process, started when
//! the first waiter, resume worker or timer worker needs it, forwards the
//! notifications of every process. A lost notification costs latency
//! (waiters and workers still poll), never work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use keiro_store::Store;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::inflight::InFlight;
use super::lock;

/// The wake-ups of one database in this process.
pub(crate) struct Wakes {
    /// Timer worker loops idling on this database.
    timers: Notify,
    /// The runtimes on this database: their in-flight registries and their
    /// resume workers' wake.
    runtimes: Mutex<Vec<(Weak<InFlight>, Weak<Notify>)>>,
    /// The PostgreSQL listener task, once started.
    #[cfg(feature = "postgres")]
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Wakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakes").finish_non_exhaustive()
    }
}

/// The wake-ups of each database this process uses, by [`database_key`].
static WAKES: Mutex<Option<HashMap<String, Weak<Wakes>>>> = Mutex::new(None);

impl Wakes {
    /// The wake-ups of `store`'s database, shared with every other user of
    /// that database in this process.
    pub(crate) fn of(store: &Store) -> Arc<Wakes> {
        let key = database_key(store);
        let mut all = lock(&WAKES);
        let all = all.get_or_insert_with(HashMap::new);
        if let Some(wakes) = all.get(&key).and_then(Weak::upgrade) {
            return wakes;
        }
        all.retain(|_, wakes| wakes.strong_count() > 0);
        let wakes = Arc::new(Wakes {
            timers: Notify::new(),
            runtimes: Mutex::new(Vec::new()),
            #[cfg(feature = "postgres")]
            listener: Mutex::new(None),
        });
        all.insert(key, Arc::downgrade(&wakes));
        wakes
    }

    /// Forwards notifications for this database to a runtime's in-flight
    /// registry and resume-worker wake, for as long as both live.
    pub(crate) fn register(&self, inflight: &Arc<InFlight>, resume: &Arc<Notify>) {
        let mut runtimes = lock(&self.runtimes);
        runtimes.retain(|(inflight, _)| inflight.strong_count() > 0);
        runtimes.push((Arc::downgrade(inflight), Arc::downgrade(resume)));
    }

    /// Wakes the idle timer worker loops on this database: a timer was
    /// scheduled or moved.
    pub(crate) fn timers_changed(&self) {
        self.timers.notify_waiters();
    }

    /// Completes at the next [`Wakes::timers_changed`] (here or, once
    /// listening, in any process). Enable it before reading the store, so a
    /// change in between is not missed.
    pub(crate) fn timers_notified(&self) -> Notified<'_> {
        self.timers.notified()
    }

    /// An instance's step was recorded (`id`: its wake payload), or work
    /// became due (empty), in some process: wake the waiters on it and the
    /// resume workers.
    #[cfg(feature = "postgres")]
    fn workflow_woken(&self, id: &str) {
        for (inflight, resume) in lock(&self.runtimes).iter() {
            if let Some(inflight) = inflight.upgrade() {
                if !id.is_empty() {
                    inflight.notify_payload(id);
                }
            }
            if let Some(resume) = resume.upgrade() {
                resume.notify_one();
            }
        }
    }

    /// Notifications on this database may have been lost (the listener's
    /// connection was down): every waiter, resume worker and timer worker
    /// here looks at the store again now.
    #[cfg(feature = "postgres")]
    fn missed(&self) {
        self.timers_changed();
        for (inflight, resume) in lock(&self.runtimes).iter() {
            if let Some(inflight) = inflight.upgrade() {
                inflight.notify_all();
            }
            if let Some(resume) = resume.upgrade() {
                resume.notify_one();
            }
        }
    }

    /// On PostgreSQL, starts the task that forwards every process's
    /// notifications on `store`'s database, unless it runs already; elsewhere
    /// does nothing. Long-lived loops call it on every round: the task ends
    /// with the tokio runtime that spawned it, and several runtimes of one
    /// process (tests, say) may share a database, so a later call restarts it.
    /// Behind a transaction-pooling proxy without a direct `listen_url`
    /// there is nothing to listen on: workers find work by polling.
    pub(crate) fn listen(self: &Arc<Self>, store: &Store) {
        // With only the `postgres` feature, `Store` has no other variant.
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let Store::Postgres(pg) = store {
            if !pg.can_listen() {
                return;
            }
            let mut listener = lock(&self.listener);
            if listener.as_ref().is_none_or(|task| task.is_finished()) {
                *listener = Some(tokio::spawn(postgres::forward(
                    pg.clone(),
                    Arc::downgrade(self),
                )));
            }
        }
        #[cfg(not(feature = "postgres"))]
        let _ = store;
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        #[cfg(feature = "postgres")]
        if let Some(listener) = lock(&self.listener).take() {
            listener.abort();
        }
    }
}

/// What identifies a database across stores connected to it: two stores with
/// the same key share wake-ups. (One key for two databases would only wake
/// more than needed.)
fn database_key(store: &Store) -> String {
    #[allow(unreachable_patterns)]
    match store {
        #[cfg(feature = "sqlite")]
        Store::Sqlite(sqlite) => {
            let options = sqlite.pool().connect_options();
            format!("sqlite:{}", options.get_filename().display())
        }
        #[cfg(feature = "postgres")]
        Store::Postgres(pg) => {
            let options = pg.pool().connect_options();
            format!(
                "postgres://{}:{}{}/{}",
                options.get_host(),
                options.get_port(),
                options
                    .get_socket()
                    .map(|socket| socket.display().to_string())
                    .unwrap_or_default(),
                options.get_database().unwrap_or_default()
            )
        }
        // A backend this build of keiro leaves to another crate: one key for
        // all its databases.
        other => other.backend().to_owned(),
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    //! The listener connection: `LISTEN keiro_wake` and `keiro_timers` on
    //! one connection, replaced at once when it is lost.

    use std::sync::Weak;
    use std::time::Duration;

    use keiro_store::PostgresStore;

    use super::Wakes;

    /// Where the timer store notifies schedules (see keiro-store's timers).
    const TIMER_CHANNEL: &str = "keiro_timers";

    /// Forwards notifications to `wakes` until it is dropped.
    ///
    /// A notification sent while the connection is down is lost: once it
    /// listens again, everything on `wakes` looks at the store afresh
    /// ([`Wakes::missed`]) instead of waiting for its next poll. A lost
    /// connection is replaced at once; a failed attempt is retried after a
    /// second.
    pub(super) async fn forward(pg: PostgresStore, wakes: Weak<Wakes>) {
        let (mut missed, mut pause) = (false, false);
        loop {
            if pause {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if wakes.strong_count() == 0 {
                return;
            }
            let mut listener = match pg.listen_wakes().await {
                Ok(mut listener) => match listener.listen(TIMER_CHANNEL).await {
                    Ok(()) => listener,
                    Err(error) => {
                        tracing::warn!(%error, "keiro wake listener cannot LISTEN {TIMER_CHANNEL}");
                        pause = true;
                        continue;
                    }
                },
                Err(error) => {
                    tracing::warn!(%error, "keiro wake listener cannot connect");
                    pause = true;
                    continue;
                }
            };
            if std::mem::take(&mut missed) {
                let Some(wakes) = wakes.upgrade() else { return };
                wakes.missed();
            }
            loop {
                // `try_recv` answers `None` when the connection is lost
                // (`recv` would reconnect unseen, and what was sent in
                // between would stay lost).
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        let Some(wakes) = wakes.upgrade() else { return };
                        if notification.channel() == TIMER_CHANNEL {
                            wakes.timers_changed();
                        } else {
                            wakes.workflow_woken(notification.payload());
                        }
                    }
                    Ok(None) => {
                        tracing::warn!("keiro wake listener lost its connection; listening again");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "keiro wake listener lost its connection");
                        break;
                    }
                }
            }
            (missed, pause) = (true, false);
        }
    }
}
