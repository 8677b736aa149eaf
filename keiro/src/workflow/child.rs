//! Child workflows: a `#[workflow]` call awaited (or [`spawn`]ed) inside
//! another workflow. The child is its own instance with a deterministic id;
//! its end is recorded in the parent's journal in the same transaction that
//! records it, which also makes a suspended parent due.

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keiro_store::Outcome;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::launch::launch;
use crate::context::{
    halt, wait_for_step, with_deadline, Durable, Halt, StepKind, WorkflowContext,
};
use crate::registry::BoxFuture;
use crate::{Error, Result, WorkflowCall};

/// A child workflow started by [`spawn`]; await it to join it.
#[must_use = "a spawned child is joined only by awaiting its handle"]
pub struct ChildHandle<R> {
    cx: Arc<WorkflowContext>,
    seq: i64,
    name: &'static str,
    id: String,
    _output: PhantomData<fn() -> R>,
}

impl<R> std::fmt::Debug for ChildHandle<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildHandle")
            .field("name", &self.name)
            .field("id", &self.id)
            .finish()
    }
}

impl<R> ChildHandle<R> {
    /// The child's instance id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Starts a child workflow without waiting for it, so a workflow can fan out
/// several and join them in order. Only inside a workflow; elsewhere use
/// [`WorkflowCall::start`].
///
/// This, not `tokio::spawn`, is how a workflow runs work concurrently: each
/// child is journaled as a workflow of its own.
///
/// A spawned child starts at once, in this process: a call given queue or
/// debounce settings (`.queue`, `.priority`, `.partition`, `.dedup`,
/// `.delay`, `.debounce`) is refused with [`Error::InvalidOption`], since
/// they would not hold. Put such a child on its queue with
/// [`WorkflowCall::enqueue`] instead.
///
/// ```no_run
/// #[keiro::workflow]
/// async fn resize(image: String) -> String {
///     format!("{image}@small")
/// }
///
/// #[keiro::workflow]
/// async fn album(images: Vec<String>) -> Result<Vec<String>, String> {
///     // keiro::Error is not journaled as a workflow's error: map it.
///     let mut children = Vec::new();
///     for image in images {
///         children.push(keiro::spawn(resize(image)).await.map_err(|e| e.to_string())?);
///     }
///     let mut out = Vec::new();
///     for child in children {
///         out.push(child.await.map_err(|e| e.to_string())?); // joined in order
///     }
///     Ok(out)
/// }
/// ```
pub async fn spawn<R>(call: WorkflowCall<R>) -> Result<ChildHandle<R>>
where
    R: Serialize + DeserializeOwned + Send + 'static,
{
    if call.parent.is_none() {
        return Err(Error::NotInWorkflow {
            op: format!("keiro::spawn({})", call.name),
            instead: "it starts a child of the calling workflow, so outside one use `.start()`",
        });
    }
    // A spawned child runs at once in this process: a queue's limits, a
    // delay or a debounce would be dropped without a word.
    call.refuse_queue("was spawned with `keiro::spawn`")?;
    start_child(call).await
}

/// Starts (or, on replay, finds) the child of `call`, whose parent slot is set.
pub(crate) async fn start_child<R>(call: WorkflowCall<R>) -> Result<ChildHandle<R>>
where
    R: Serialize + DeserializeOwned + Send + 'static,
{
    let (cx, seq) = call.parent.clone().expect("a child call has a parent");
    let spec = call.launch_spec(&cx.keiro)?;
    let handle = ChildHandle {
        cx: cx.clone(),
        seq,
        name: call.name,
        id: spec.id.clone(),
        _output: PhantomData,
    };
    if cx.recorded(seq).is_none() {
        if cx.replay_only {
            return crate::context::beyond_history(&cx).await;
        }
        // Started only after what the run journaled before is durable.
        crate::context::pipeline::barrier(&cx).await;
        // Starting it is idempotent on its id: after a crash this attaches to
        // the child already running, or finds it finished.
        let started = match call.runtime().await {
            Ok(keiro) => launch(&keiro, spec).await.map(drop),
            Err(error) => Err(error),
        };
        match started {
            Ok(()) => {}
            // Not the call recorded under this id: the workflow's own error
            // to handle, not a crash to retry.
            Err(
                error @ (Error::IdConflict { .. }
                | Error::InputMismatch { .. }
                | Error::SignatureMismatch { .. }),
            ) => return Err(error),
            Err(error) => return halt(&cx, Halt::Error(error)).await,
        }
    }
    Ok(handle)
}

impl<R: DeserializeOwned + Send + 'static> ChildHandle<R> {
    /// Waits for the child's end at most `duration` (from now, journaled
    /// when the wait first runs: a crash or replay keeps the original
    /// deadline); `Ok(None)` once it has passed with the child still
    /// running. The child keeps running; its end is recorded but nobody
    /// reads it (cancel it with [`crate::cancel`] if it should stop).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// #[keiro::workflow]
    /// async fn render(page: String) -> String {
    ///     page
    /// }
    ///
    /// #[keiro::workflow]
    /// async fn site(page: String) -> Result<String, String> {
    ///     let child = keiro::spawn(render(page)).await.map_err(|e| e.to_string())?;
    ///     let child_id = child.id().to_owned();
    ///     match child.timeout(Duration::from_secs(60)).await.map_err(|e| e.to_string())? {
    ///         Some(html) => Ok(html),
    ///         None => Err(format!("{child_id} took longer than a minute")),
    ///     }
    /// }
    /// ```
    pub fn timeout(self, duration: Duration) -> ChildTimeout<R> {
        ChildTimeout {
            deadline: self.cx.keiro.clock().now() + duration,
            // The deadline, and which came first.
            seq: self.cx.next_seq_pair(),
            handle: self,
        }
    }
}

/// A [`ChildHandle`] with a deadline ([`ChildHandle::timeout`]); yields
/// `Ok(None)` when it passes first.
#[must_use = "a child is joined only by awaiting its handle"]
#[derive(Debug)]
pub struct ChildTimeout<R> {
    handle: ChildHandle<R>,
    deadline: SystemTime,
    seq: i64,
}

impl<R: DeserializeOwned + Send + 'static> IntoFuture for ChildTimeout<R> {
    type Output = Result<Option<R>>;
    type IntoFuture = BoxFuture<'static, Result<Option<R>>>;

    fn into_future(self) -> Self::IntoFuture {
        let cx = self.handle.cx.clone();
        Box::pin(async move {
            with_deadline(cx, self.seq, self.deadline, self.handle.into_future())
                .await
                .transpose()
        })
    }
}

impl<R: DeserializeOwned + Send + 'static> Durable for ChildHandle<R> {}
impl<R: DeserializeOwned + Send + 'static> Durable for ChildTimeout<R> {}

impl<R> IntoFuture for ChildHandle<R>
where
    R: DeserializeOwned + Send + 'static,
{
    type Output = Result<R>;
    type IntoFuture = BoxFuture<'static, Result<R>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let row = wait_for_step(&self.cx, self.seq, StepKind::Child.as_str(), self.name).await;
            #[derive(serde::Deserialize)]
            struct Failure {
                status: String,
                message: String,
                #[serde(default)]
                deadline: Option<i64>,
            }
            let end = match Outcome::decode_as::<R, Failure>(&row.result) {
                Ok(end) => end,
                Err(e) => {
                    let what = format!(
                        "the recorded end of child workflow `{}` (id {}) of workflow `{}` \
                         (id {}) into the child's current return type",
                        self.name, self.id, self.cx.name, self.cx.id
                    );
                    return halt(&self.cx, Halt::Error(Error::decode(what, e))).await;
                }
            };
            match end {
                Ok(value) => Ok(value),
                Err(failure) => {
                    let (name, id) = (self.name.to_owned(), self.id.clone());
                    let source = match failure.status.as_str() {
                        "cancelled" => Error::Cancelled { name, id },
                        "timed_out" => Error::TimedOut {
                            name,
                            id,
                            deadline: crate::time::from_us(failure.deadline.unwrap_or(0)),
                        },
                        _ => Error::Failed {
                            name,
                            id,
                            message: failure.message,
                        },
                    };
                    Err(Error::ChildFailed {
                        name: self.name.to_owned(),
                        id: self.id,
                        parent_id: self.cx.id.clone(),
                        source: Arc::new(source),
                    })
                }
            }
        })
    }
}
