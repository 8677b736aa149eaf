//! The runtime handle: a connected store, its journal writer, the registry and
//! this process's executor identity.

mod builder;
mod global;
pub(crate) mod identity;
pub(crate) mod inflight;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro_store::{JournalWriter, Store};
use tokio::sync::{watch, OnceCell};

use crate::registry::Registry;
use crate::{Error, Result};

pub use builder::KeiroBuilder;
pub use global::{
    global, init, DATABASE_URL_ENV, DEFAULT_DATABASE_URL, EXECUTOR_ID_ENV, SQLITE_SYNCHRONOUS_ENV,
};

/// The outcome of one in-process run, shared with every caller waiting on it.
pub(crate) type RunResult = Option<Result<keiro_store::InstanceRow>>;

/// A connected keiro runtime. Cheap to clone; every clone shares one store,
/// one journal writer and one registry.
#[derive(Clone)]
pub struct Keiro {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) writer: JournalWriter,
    pub(crate) registry: Registry,
    /// The identity asked for: explicit (exclusive) or the default base.
    pub(crate) requested_id: String,
    /// Whether `requested_id` was set explicitly, so no other is taken.
    pub(crate) exclusive: bool,
    pub(crate) lease_ttl: Duration,
    pub(crate) max_attempts: u32,
    /// Waits longer than this suspend the workflow instead of holding memory.
    pub(crate) suspend_after: Duration,
    /// How long a caller waits on a due instance that no live worker serves
    /// before `result()` says so.
    pub(crate) no_worker_timeout: Duration,
    /// Set once this process's resume worker has recorded the workflow names
    /// it serves.
    pub(crate) serving: OnceCell<()>,
    /// The identity this runtime took, once it runs workflows; read through
    /// [`Keiro::owner`].
    pub(crate) executor: OnceCell<crate::runtime::identity::Registration>,
    /// Set by [`Keiro::shutdown`]: in-process runs, workers and the heartbeat
    /// stop.
    pub(crate) stop: watch::Sender<bool>,
    /// Wakes this process's resume worker (work was enqueued here, or a
    /// notification arrived).
    pub(crate) wake: tokio::sync::Notify,
    /// Workflow runs of this process waiting in memory for a recorded step.
    pub(crate) waiters: crate::runtime::inflight::WaiterMap,
    /// Whether this runtime's PostgreSQL wake listener is started.
    pub(crate) listening: std::sync::atomic::AtomicBool,
    /// Live runs in this process, so a cancellation stops them at once.
    pub(crate) live: Mutex<HashMap<String, std::sync::Weak<crate::context::WorkflowContext>>>,
    /// Instances this process is running now, so a second caller attaches to
    /// the run in flight instead of starting another.
    pub(crate) running: Mutex<HashMap<String, (&'static str, watch::Receiver<RunResult>)>>,
}

impl std::fmt::Debug for Keiro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keiro")
            .field("backend", &self.inner.store.backend())
            .field("executor_id", &self.owner())
            .finish_non_exhaustive()
    }
}

impl Keiro {
    /// The store this runtime journals into.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// This runtime's executor identity, the owner name on its leases: the
    /// one it took when it first ran a workflow (a default identity may carry
    /// a `#N` suffix), or before that, the one it will ask for first.
    pub fn executor_id(&self) -> &str {
        self.owner()
    }

    /// The names of the workflows linked into this binary, sorted.
    pub fn workflow_names(&self) -> Vec<&'static str> {
        self.inner.registry.names()
    }

    /// Puts an instance that was set aside for non-determinism back in line,
    /// journal intact, so the fixed code resumes it: the next call with its id
    /// (or a resume worker) runs it. Errors when no such instance is set aside.
    pub async fn resume(&self, id: &str) -> Result<()> {
        if self.inner.store.requeue_set_aside(id).await? {
            return Ok(());
        }
        match self.inner.store.get_instance(id).await? {
            None => Err(Error::NotFound { id: id.to_owned() }),
            Some(row) => Err(Error::Config(format!(
                "workflow `{}` (id {id}) is {}, not set aside for non-determinism; \
                 there is nothing to resume",
                row.name,
                row.status.as_str()
            ))),
        }
    }
}
