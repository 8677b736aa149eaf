//! This process's executor identity: the owner name on its leases, held by at
//! most one live process at a time.

use std::sync::{Arc, Weak};
use std::time::Duration;

use keiro_store::{now_ms, ExecutorRow};

use crate::runtime::Inner;
use crate::{Error, Keiro, Result};

/// An identity whose holder has not sent a heartbeat for this long is free.
pub(crate) const EXECUTOR_TTL: Duration = Duration::from_secs(10);

impl Keiro {
    /// Takes this runtime's executor identity (once): refuses if another live
    /// process holds it; takes it over at once from a dead process on this host
    /// (and after [`EXECUTOR_TTL`] from one elsewhere), then makes the leases
    /// the predecessor held due now so they resume without waiting out a TTL.
    pub(crate) async fn ensure_executor(&self) -> Result<()> {
        self.inner
            .executor_token
            .get_or_try_init(|| register(self))
            .await
            .map(|_| ())
    }
}

async fn register(keiro: &Keiro) -> Result<String> {
    let store = &keiro.inner.store;
    let id = keiro.inner.executor_id.clone();
    let me = ExecutorRow {
        id: id.clone(),
        token: uuid::Uuid::new_v4().to_string(),
        host: crate::runtime::host_name(),
        pid: i64::from(std::process::id()),
        heartbeat_at: now_ms(),
    };
    let mut taken = false;
    for _ in 0..5 {
        let replacing = match store.get_executor(&id).await? {
            None => None,
            Some(old) => {
                let stale = old.heartbeat_at < now_ms() - EXECUTOR_TTL.as_millis() as i64;
                let dead_here = old.host == me.host && old.pid != me.pid && !pid_alive(old.pid);
                if !(stale || dead_here) {
                    return Err(Error::ExecutorIdInUse {
                        id,
                        host: old.host,
                        pid: old.pid,
                    });
                }
                Some(old.token)
            }
        };
        if store.put_executor(&me, replacing.as_deref()).await? {
            taken = true;
            break;
        }
    }
    if !taken {
        return Err(Error::Config(format!(
            "could not register executor identity `{id}`: other processes keep taking it"
        )));
    }
    let reclaimed = store.reclaim_own(&id).await?;
    if reclaimed > 0 {
        tracing::info!(executor = %id, reclaimed, "keiro reclaimed a predecessor's leases");
    }
    tokio::spawn(heartbeat(Arc::downgrade(&keiro.inner), me.token.clone()));
    Ok(me.token)
}

/// Refreshes the identity until the runtime is dropped.
async fn heartbeat(inner: Weak<Inner>, token: String) {
    let mut tick = tokio::time::interval(EXECUTOR_TTL / 4);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        match inner
            .store
            .heartbeat_executor(&inner.executor_id, &token)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::error!(
                    executor = %inner.executor_id,
                    "keiro executor identity was taken over by another process"
                );
                return;
            }
            Err(error) => tracing::warn!(%error, "keiro executor heartbeat failed; retrying"),
        }
    }
}

fn pid_alive(pid: i64) -> bool {
    let proc_root = std::path::Path::new("/proc");
    if !proc_root.join("self").exists() {
        // No procfs: cannot tell, so assume alive and rely on the heartbeat TTL.
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
        return false;
    };
    // A zombie (state Z) is dead for our purposes.
    stat.rsplit_once(')')
        .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        .unwrap_or(true)
}
