//! On PostgreSQL, the task that forwards `keiro_wake` notifications from
//! every process to this process's waiters and resume worker.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Inner, Keiro};

impl Keiro {
    /// On PostgreSQL, starts (once) the task that forwards `keiro_wake`
    /// notifications to this process's waiters and resume worker.
    pub(crate) fn ensure_listener(&self) {
        let keiro_store::Store::Postgres(pg) = &self.inner.store else {
            return;
        };
        if self.inner.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        let pg = pg.clone();
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                match pg.listen_wakes().await {
                    Ok(mut listener) => loop {
                        match listener.recv().await {
                            Ok(notification) => {
                                let Some(inner): Option<Arc<Inner>> = inner.upgrade() else {
                                    return;
                                };
                                let id = notification.payload();
                                if !id.is_empty() {
                                    inner.inflight.notify(id);
                                }
                                inner.wake.notify_one();
                            }
                            Err(error) => {
                                tracing::warn!(%error, "keiro wake listener lost its connection");
                                break;
                            }
                        }
                    },
                    Err(error) => tracing::warn!(%error, "keiro wake listener cannot connect"),
                }
                if inner.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
    }
}
