//! What a started workflow gives back: [`WorkflowHandle`] and the
//! [`WorkflowStatus`] it reports.

use std::marker::PhantomData;

use keiro_store::{InstanceRow, InstanceStatus};
use serde::de::DeserializeOwned;

use super::launch::{follow, wait};
use crate::context::describe;
use crate::registry::RunFn;
use crate::{Error, Keiro, Result};

/// Where a workflow instance stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkflowStatus {
    /// Enqueued, not yet claimed by any executor.
    Pending,
    /// Claimed and running (or crashed while running, until resumed).
    Running,
    /// Waiting on a timer, an awakeable or a child; costs only its row.
    Suspended,
    /// Returned a value (not an `Err`).
    Completed,
    /// Returned an `Err`, or was marked failed after its crash attempts.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Ended at its deadline, or an ancestor's, before it finished
    /// (`call.timeout(..)` / `call.deadline(..)`).
    TimedOut,
    /// Set aside because the code no longer matches its journal; the journal is
    /// untouched and [`Keiro::resume`] puts it back in line once fixed.
    NonDeterministic {
        /// What the journal recorded at the diverging step.
        expected: String,
        /// What the code called there.
        found: String,
    },
}

impl WorkflowStatus {
    pub(crate) fn of(row: &InstanceRow) -> WorkflowStatus {
        match row.status {
            InstanceStatus::Pending => WorkflowStatus::Pending,
            InstanceStatus::Running => WorkflowStatus::Running,
            InstanceStatus::Suspended => WorkflowStatus::Suspended,
            InstanceStatus::Completed => WorkflowStatus::Completed,
            InstanceStatus::Failed => WorkflowStatus::Failed,
            InstanceStatus::Cancelled => WorkflowStatus::Cancelled,
            InstanceStatus::TimedOut => WorkflowStatus::TimedOut,
            InstanceStatus::NonDeterministic => {
                let (_, expected, found) = nondeterminism_of(row);
                WorkflowStatus::NonDeterministic { expected, found }
            }
            _ => WorkflowStatus::Running,
        }
    }

    /// Whether the instance is done (completed, failed, cancelled, timed out or
    /// set aside).
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            WorkflowStatus::Pending | WorkflowStatus::Running | WorkflowStatus::Suspended
        )
    }
}

/// A handle on one workflow instance, wherever it runs.
pub struct WorkflowHandle<R> {
    keiro: Keiro,
    id: String,
    /// Set for handles of runs started in this process, which this process
    /// drives on when they come due again.
    run: Option<RunFn>,
    _output: PhantomData<fn() -> R>,
}

impl<R> std::fmt::Debug for WorkflowHandle<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowHandle")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<R: DeserializeOwned> WorkflowHandle<R> {
    pub(crate) fn new(keiro: Keiro, id: String, run: Option<RunFn>) -> Self {
        WorkflowHandle {
            keiro,
            id,
            run,
            _output: PhantomData,
        }
    }

    /// The instance id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where the instance stands now.
    pub async fn status(&self) -> Result<WorkflowStatus> {
        Ok(WorkflowStatus::of(&self.row().await?))
    }

    /// Waits for the instance to end and returns its output, or the error that
    /// ended it (cancelled, set aside, failed after crashes).
    ///
    /// It reads the store while it waits; transient store errors (a restart
    /// or failover of PostgreSQL) are waited out for up to 60 s in a row,
    /// then returned ([`Error::is_transient`]: wait again).
    pub async fn result(&self) -> Result<R> {
        let in_process = self.keiro.inflight().attach(&self.id);
        let row = match in_process {
            Some(receiver) => wait(&self.keiro, &self.id, receiver, self.run).await?,
            None => follow(&self.keiro, &self.id, self.run).await?,
        };
        outcome_of(&row)
    }

    async fn row(&self) -> Result<InstanceRow> {
        self.keiro
            .raw_store()
            .get_instance(&self.id)
            .await?
            .ok_or_else(|| Error::NotFound {
                id: self.id.clone(),
            })
    }
}

impl Keiro {
    /// A handle on an existing instance. Errors with [`Error::NotFound`] when no
    /// instance has this id.
    pub async fn handle<R: DeserializeOwned>(
        &self,
        id: impl Into<String>,
    ) -> Result<WorkflowHandle<R>> {
        let id = id.into();
        Error::check_id("workflow id", &id)?;
        let handle = WorkflowHandle::new(self.clone(), id, None);
        handle.row().await?;
        Ok(handle)
    }
}

/// A handle on an existing instance, through the process-wide runtime.
/// It never starts anything and never compares arguments: the way to read
/// what a workflow id returned, wherever and whenever it ran.
///
/// ```no_run
/// # async fn demo() -> Result<(), keiro::Error> {
/// let handle = keiro::handle::<Result<String, String>>("order-42").await?;
/// println!("order-42 is {:?}", handle.status().await?);
/// let receipt = handle.result().await?; // waits for the end
/// # Ok(()) }
/// ```
pub async fn handle<R: DeserializeOwned>(id: impl Into<String>) -> Result<WorkflowHandle<R>> {
    crate::runtime::global().await?.handle(id).await
}

/// Turns a final row into what the caller sees: the decoded output, or the
/// error that ended it.
pub(crate) fn outcome_of<R: serde::de::DeserializeOwned>(row: &InstanceRow) -> Result<R> {
    match (row.status, &row.output) {
        (InstanceStatus::Completed | InstanceStatus::Failed, Some(output)) => {
            serde_json::from_str(output).map_err(|e| {
                Error::decode(
                    format!(
                        "the stored output of workflow `{}` (id {}) into the requested type",
                        row.name, row.id
                    ),
                    e,
                )
            })
        }
        (InstanceStatus::Cancelled, _) => Err(Error::Cancelled {
            name: row.name.clone(),
            id: row.id.clone(),
        }),
        (InstanceStatus::TimedOut, _) => Err(Error::TimedOut {
            name: row.name.clone(),
            id: row.id.clone(),
            deadline: crate::time::from_us(row.deadline.unwrap_or(row.updated_at)),
        }),
        (InstanceStatus::NonDeterministic, _) => {
            let (seq, expected, found) = nondeterminism_of(row);
            Err(Error::NonDeterministic {
                name: row.name.clone(),
                id: row.id.clone(),
                seq,
                expected,
                found,
            })
        }
        _ => Err(Error::Failed {
            name: row.name.clone(),
            id: row.id.clone(),
            message: row
                .error
                .clone()
                .unwrap_or_else(|| format!("it is {}", row.status.as_str())),
        }),
    }
}

/// The stored diagnostic of a set-aside instance: (seq, expected, found).
pub(crate) fn nondeterminism_of(row: &InstanceRow) -> (i64, String, String) {
    let parsed: Option<serde_json::Value> = row
        .error
        .as_deref()
        .and_then(|e| serde_json::from_str(e).ok());
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    (
        parsed
            .as_ref()
            .and_then(|v| v.get("seq"))
            .and_then(|v| v.as_i64())
            .unwrap_or(-1),
        field("expected").unwrap_or_else(|| describe("step", "?")),
        field("found").unwrap_or_else(|| row.error.clone().unwrap_or_default()),
    )
}
