//! Ending workflows from outside ([`cancel`]) and from inside
//! ([`continue_as_new`]).

use crate::context::{current, halt, Halt};
use crate::{Error, Keiro, Result, WorkflowCall, WorkflowStatus};

/// What [`cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The instance and these unfinished descendants (the target first) are
    /// now cancelled. Running ones stop at their next step, sleep or await
    /// (at once in this process; within a lease renewal elsewhere).
    Cancelled {
        /// Every instance cancelled, the target first.
        ids: Vec<String>,
    },
    /// The instance had ended already with this status; nothing changed.
    AlreadyFinished(WorkflowStatus),
}

impl Keiro {
    /// Cancels instance `id` and, in the same transaction, its unfinished
    /// children (recursively). A parent awaiting a cancelled child gets an
    /// error saying so. Cancelling a finished instance changes nothing and
    /// says so. Errors with [`Error::NotFound`] for an unknown id. A
    /// transient store error (a deadlock, a lost connection) is retried for
    /// up to 30 s before it is returned; when a retry finds the instance
    /// cancelled, the earlier try took effect unseen, and the outcome is
    /// [`CancelOutcome::Cancelled`] naming `id` alone (its descendants were
    /// cancelled with it, in the same transaction).
    pub async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
        Error::check_id("workflow id", id)?;
        // Cancelling a tree while a child in it times out on its own may
        // lock the same rows in opposite orders on PostgreSQL, and this
        // transaction may be picked as a deadlock's victim. Going again is
        // safe: the cancel reads the instance's status under its row lock
        // first, and an ended one is left as it is.
        let store = self.raw_store();
        // Whether a try failed without an answer: it may have committed.
        let unanswered = std::sync::atomic::AtomicBool::new(false);
        let cancelled = crate::retry::retrying(("", id), "cancelling", || async {
            let tried = store.cancel(id).await;
            if tried.as_ref().is_err_and(|error| !error.is_answered()) {
                unanswered.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            tried
        });
        let cancelled = match cancelled.await.0? {
            // A try whose answer was lost committed unseen: this call's own
            // cancel, whose descendants it cannot name.
            keiro_store::Cancellation::AlreadyFinal(keiro_store::InstanceStatus::Cancelled)
                if unanswered.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                keiro_store::Cancellation::Cancelled(vec![id.to_owned()])
            }
            other => other,
        };
        match cancelled {
            keiro_store::Cancellation::NotFound => Err(Error::NotFound { id: id.to_owned() }),
            keiro_store::Cancellation::AlreadyFinal(_) => {
                let row = self
                    .raw_store()
                    .get_instance(id)
                    .await?
                    .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
                Ok(CancelOutcome::AlreadyFinished(WorkflowStatus::of(&row)))
            }
            keiro_store::Cancellation::Cancelled(ids) => {
                for cancelled in &ids {
                    if let Some(cx) = self.inflight().live(cancelled) {
                        cx.halt(Halt::Cancelled);
                    }
                    self.step_recorded(cancelled);
                }
                tracing::info!(id, cancelled = ids.len(), "keiro cancelled a workflow");
                Ok(CancelOutcome::Cancelled { ids })
            }
        }
    }

    /// Ends instance `id` and its unfinished descendants as timed out when its
    /// deadline has passed, through the cancellation path: running ones in
    /// this process stop at once, elsewhere within a lease renewal, and a
    /// parent awaiting the instance gets [`Error::TimedOut`] from its child
    /// call. Returns whether this call ended it (`false`: the deadline has
    /// not passed, or the instance had ended already).
    pub(crate) async fn time_out(&self, id: &str) -> Result<bool> {
        // A parent's time-out ends its tree while a child times out on its
        // own (their deadlines are one): on PostgreSQL the two transactions
        // may lock the same rows in opposite orders, and one is picked as a
        // deadlock's victim. Going again is safe: the time-out reads the
        // instance's status first, and an ended one is left as it is.
        let store = self.raw_store();
        let ended = crate::retry::retrying(("", id), "timing out", || store.time_out(id));
        let Some(keiro_store::Cancellation::Cancelled(ids)) = ended.await.0? else {
            return Ok(false);
        };
        for ended in &ids {
            if let Some(cx) = self.inflight().live(ended) {
                cx.halt(Halt::Cancelled);
            }
            self.step_recorded(ended);
        }
        tracing::info!(
            id,
            ended = ids.len(),
            "keiro timed out a workflow at its deadline"
        );
        // The instance may be a child whose own deadline came first: its
        // parent runs on, and learns of the end at once.
        let row = self.raw_store().get_instance(id).await?;
        if let Some(parent) = row.and_then(|row| row.parent_id) {
            self.step_recorded(&parent);
            if let Err(error) = self.raw_store().wake_workers(&parent).await {
                tracing::debug!(%error, "keiro could not notify a parent's process");
            }
        }
        for ended in &ids {
            if let Err(error) = self.raw_store().wake_workers(ended).await {
                tracing::debug!(%error, "keiro could not notify a timed-out workflow's followers");
            }
        }
        Ok(true)
    }

    /// Puts an instance that was set aside for non-determinism back in line,
    /// journal intact, so the fixed code resumes it: the next call with its id
    /// (or a resume worker) runs it. Errors when no such instance is set aside,
    /// and with [`Error::Duplicate`] when another unfinished instance took its
    /// queue's dedup key meanwhile.
    pub async fn resume(&self, id: &str) -> Result<()> {
        Error::check_id("workflow id", id)?;
        let requeued = self.raw_store().requeue_set_aside(id).await;
        if requeued.map_err(Error::from_store)? {
            return Ok(());
        }
        match self.raw_store().get_instance(id).await? {
            None => Err(Error::NotFound { id: id.to_owned() }),
            Some(row) => Err(Error::NotSetAside {
                name: row.name,
                id: id.to_owned(),
                status: row.status.as_str().to_owned(),
            }),
        }
    }
}

/// Cancels instance `id` through the process-wide runtime (see [`Keiro::cancel`]).
///
/// ```no_run
/// use keiro::CancelOutcome;
///
/// # async fn demo() -> Result<(), keiro::Error> {
/// match keiro::cancel("order-42").await? {
///     CancelOutcome::Cancelled { ids } => println!("cancelled {ids:?}"),
///     CancelOutcome::AlreadyFinished(status) => println!("already {status:?}"),
///     _ => {}
/// }
/// # Ok(()) }
/// ```
pub async fn cancel(id: &str) -> Result<CancelOutcome> {
    crate::runtime::global().await?.cancel(id).await
}

/// Ends the current generation of the calling workflow and starts the next
/// under the same id with `call`'s arguments and a fresh journal; the old
/// generation's journal is kept. `call` must be a call of the same workflow:
///
/// ```no_run
/// # use keiro::workflow;
/// #[workflow]
/// async fn counter(n: u64) -> Result<u64, String> {
///     if n < 1_000 {
///         return keiro::continue_as_new(counter(n + 1))
///             .await
///             .map_err(|e| e.to_string());
///     }
///     Ok(n)
/// }
/// ```
///
/// Inside a workflow it never returns. Outside one, or with a call of another
/// workflow, it returns an error; so it does for a call given settings the
/// next generation would not take ([`Error::InvalidOption`]: queue settings,
/// a debounce, a timeout or deadline, an id other than the instance's own),
/// since it stays the same instance, on the same queue and under the same
/// deadline.
pub async fn continue_as_new<R, T>(call: WorkflowCall<R>) -> Result<T>
where
    R: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    let Some(cx) = current() else {
        return Err(Error::NotInWorkflow {
            op: format!("keiro::continue_as_new({})", call.name),
            instead: "outside one, call the workflow to start it",
        });
    };
    if call.name != cx.name {
        return Err(Error::ContinueAsOther {
            name: cx.name.clone(),
            id: cx.id.clone(),
            requested: call.name.to_owned(),
        });
    }
    call.refuse_for_continue_as_new(&cx.id)?;
    let input = call.encoded_input()?;
    crate::json::check_size(
        &input,
        cx.keiro.max_payload_bytes(),
        &cx.name,
        &cx.id,
        || "the input of its next generation (continue_as_new)".to_owned(),
    )?;
    halt(&cx, Halt::ContinueAsNew { input }).await
}
