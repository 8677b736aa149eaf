//! Replaying a [`History`] against the current code of its workflow with no
//! side effects: the engine of [`crate::testing::replay`] and
//! [`crate::Keiro::check`].
//!
//! The history is imported into a private in-memory SQLite runtime and the
//! workflow body runs there with a context in replay-only mode
//! ([`WorkflowContext::replaying`]): journaled entries come back as
//! recorded and are checked by the engine's own replay code (so a
//! divergence is the very [`Error::NonDeterministic`] a worker would set an
//! instance aside with), and where the code goes beyond the history (a step
//! body to run, a child to start, a wait the history does not answer) the
//! run stops before anything runs. Whatever else the code writes (a
//! message sent, an event set) lands in the private store.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use keiro_store::{Clock, CreateRequest};

use super::History;
use crate::context::{self, Halt, WorkflowContext};
use crate::panic::panic_message;
use crate::registry::{RunFn, WorkflowInput, WorkflowOutput};
use crate::{Error, Keiro};

/// What a replay that found no divergence saw.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Replayed {
    /// How many of the history's entries the code reached, each found as
    /// recorded.
    pub matched: usize,
    /// How many entries the history holds.
    pub entries: usize,
    /// Where the replay ended.
    pub stop: ReplayStop,
}

/// Where a replay without divergence ended.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ReplayStop {
    /// The code reached a point the history has not recorded (a step it
    /// would run, a child it would start, a wait the history does not
    /// answer): in production it goes on from there.
    HistoryEnd,
    /// The workflow returned after every entry of the history.
    Returned {
        /// What it returned, as JSON.
        output: serde_json::Value,
        /// Whether that is the history's recorded output; `None` when the
        /// history has none (it had not finished).
        matches_history: Option<bool>,
    },
    /// The generation ended with `keiro::continue_as_new` after every entry
    /// of the history.
    ContinuedAsNew,
}

impl Replayed {
    /// Whether the workflow returned with the history's recorded output.
    pub fn output_matches(&self) -> bool {
        matches!(
            self.stop,
            ReplayStop::Returned {
                matches_history: Some(true),
                ..
            }
        )
    }
}

/// Why a replay failed. Its `Display` is a sentence naming the workflow and
/// the instance, with the expected/found diff for a divergence, so
/// `replay(..).unwrap()` in a test prints what changed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The current code diverges from the history (see [`Divergence`]).
    #[error(
        "replaying {0}; instances in flight at this point would be set aside as \
         non-deterministic (keep the old path behind `keiro::patched(..)`, or let them \
         finish first)"
    )]
    Diverged(Divergence),
    /// The history is of another workflow than the code replayed against it.
    #[error(
        "the history of instance `{id}` is of workflow `{history}`, not of workflow \
         `{code}`; replay it against `{history}`"
    )]
    OtherWorkflow {
        /// The instance id of the history.
        id: String,
        /// The workflow the history is of.
        history: String,
        /// The workflow it was replayed against.
        code: String,
    },
    /// The replay failed before reaching a verdict: the history's input or
    /// a recorded result no longer decodes into the code's types, the
    /// workflow panicked or returned a keiro error, or the private runtime
    /// could not be set up.
    #[error("replaying workflow `{workflow}` (id {id}) failed: {source}")]
    Failed {
        /// The workflow name.
        workflow: String,
        /// The instance id of the history.
        id: String,
        /// What went wrong.
        #[source]
        source: Error,
    },
}

/// Where the current code diverges from a history: at `seq` the history
/// recorded `expected` where the code now calls `found`, with the same
/// descriptions as [`crate::WorkflowStatus::NonDeterministic`] (e.g.
/// ``step `reserve` ``, `keiro::now() `now``, `the workflow returning
/// before it`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Divergence {
    /// The workflow name.
    pub workflow: String,
    /// The instance id of the history.
    pub id: String,
    /// The step sequence number where code and history disagree.
    pub seq: i64,
    /// What the history recorded there.
    pub expected: String,
    /// What the code calls there.
    pub found: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "workflow `{}` (id {}) against the current code diverges at step {}: the history \
             recorded {} but the code now calls {}",
            self.workflow, self.id, self.seq, self.expected, self.found
        )
    }
}

impl ReplayError {
    /// The divergence, when that is what failed the replay.
    pub fn divergence(&self) -> Option<&Divergence> {
        match self {
            ReplayError::Diverged(divergence) => Some(divergence),
            _ => None,
        }
    }

    pub(crate) fn failed(history: &History, source: Error) -> ReplayError {
        ReplayError::Failed {
            workflow: history.workflow.clone(),
            id: history.id.clone(),
            source,
        }
    }
}

/// A private in-memory runtime to replay histories in.
pub(crate) struct Replayer {
    keiro: Keiro,
    /// The private runtime's clock, set to each history's own time.
    clock: Clock,
}

impl Replayer {
    /// A fresh private runtime: SQLite in memory, waits never held in memory
    /// (a wait the history does not answer ends the replay at once), on a
    /// manual clock.
    pub(crate) async fn new() -> crate::Result<Replayer> {
        let clock = Clock::manual(SystemTime::now());
        let keiro = Keiro::builder("sqlite::memory:")
            .executor_id("keiro-replay")
            .suspend_after(Duration::ZERO)
            .clock(clock.clone())
            .connect()
            .await?;
        Ok(Replayer { keiro, clock })
    }

    /// Closes the private runtime's store.
    pub(crate) async fn close(self) {
        self.keiro.store().close().await;
    }

    /// Replays `history` with `run`, the runner of workflow `name` in this
    /// binary.
    pub(crate) async fn replay(
        &self,
        history: &History,
        name: &str,
        run: RunFn,
    ) -> Result<Replayed, ReplayError> {
        if history.workflow != name {
            return Err(ReplayError::OtherWorkflow {
                id: history.id.clone(),
                history: history.workflow.clone(),
                code: name.to_owned(),
            });
        }
        // A replay reads the history's time, not the wall clock's: a sleep
        // or timeout the history went past has passed (whenever, and on
        // whichever clock, it was recorded), one it was still waiting on has
        // not.
        if let Some(at) = history.recorded_until_us() {
            self.clock.reset_us(at);
        }
        let journal = self
            .import(history)
            .await
            .map_err(|e| ReplayError::failed(history, e))?;
        let (cx, aborted) = WorkflowContext::replaying(
            self.keiro.clone(),
            history.workflow.clone(),
            history.id.clone(),
            history.generation,
            journal,
        );
        let input = WorkflowInput {
            name: history.workflow.clone(),
            id: history.id.clone(),
            json: history.input.get().to_owned(),
        };
        let body = context::scope(
            Some(cx.clone()),
            AssertUnwindSafe(run(input)).catch_unwind(),
        );
        let stop = tokio::select! {
            biased;
            halt = aborted => match halt {
                Ok(Halt::Suspend { .. } | Halt::SuspendAny(_)) => Ok(ReplayStop::HistoryEnd),
                Ok(Halt::ContinueAsNew { .. }) => Ok(ReplayStop::ContinuedAsNew),
                Ok(Halt::Error(error)) => Err(error),
                Ok(Halt::LeaseLost) => Err(Error::Internal(
                    "a replay without side effects journals nothing, so it loses no lease".into(),
                )),
                Ok(Halt::Cancelled) => Err(Error::Cancelled {
                    name: history.workflow.clone(),
                    id: history.id.clone(),
                }),
                Err(_) => Err(Error::Internal(
                    "a replayed workflow's context was dropped before the replay ended".into(),
                )),
            },
            out = body => match out {
                Ok(Ok(output)) => match cx.unreached() {
                    Some(error) => Err(error),
                    None => Ok(returned(history, &output)),
                },
                Ok(Err(error)) => Err(error),
                Err(panic) => Err(Error::Panicked {
                    name: history.workflow.clone(),
                    id: history.id.clone(),
                    message: panic_message(panic.as_ref()),
                }),
            },
        };
        match stop {
            Ok(stop) => {
                let reached = cx.allocated();
                Ok(Replayed {
                    matched: history.entries.iter().filter(|e| e.seq < reached).count(),
                    entries: history.entries.len(),
                    stop,
                })
            }
            Err(Error::NonDeterministic {
                seq,
                expected,
                found,
                ..
            }) => Err(ReplayError::Diverged(Divergence {
                workflow: history.workflow.clone(),
                id: history.id.clone(),
                seq,
                expected,
                found,
            })),
            Err(error) => Err(ReplayError::failed(history, error)),
        }
    }

    /// Records the history's instance and journal in the private store and
    /// reads the journal back as a run reads it.
    async fn import(&self, history: &History) -> crate::Result<Vec<keiro_store::StepRow>> {
        let writer = self.keiro.writer();
        writer
            .create(CreateRequest {
                signature: history.signature.clone(),
                ..CreateRequest::new(
                    history.id.clone(),
                    history.workflow.clone(),
                    history.input.get(),
                )
            })
            .await?;
        let rows: Vec<_> = history.step_rows().collect();
        if !rows.is_empty() {
            writer.append_together(rows).await?;
        }
        Ok(self
            .keiro
            .raw_store()
            .load_journal(&history.id, history.generation)
            .await?)
    }
}

/// How a body that returned compares with the history's output.
fn returned(history: &History, output: &WorkflowOutput) -> ReplayStop {
    let output = json_value(&output.json);
    let matches_history = history
        .output
        .as_ref()
        .map(|recorded| json_value(recorded.get()) == output);
    ReplayStop::Returned {
        output,
        matches_history,
    }
}

/// Journaled JSON text as a value (text that is not JSON, which keiro never
/// journals, as a JSON string).
fn json_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
}
