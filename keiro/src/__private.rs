//! Support for the code `#[workflow]` and `#[step]` generate. Not a public API.

pub use inventory;

pub use crate::context::{step_once, step_retry, StepMeta};
pub use crate::registry::{
    BoxFuture, RunFn, SignatureFn, WorkflowInput, WorkflowOutput, WorkflowRegistration,
};
pub use crate::signature::of as signature;

use crate::{Error, Result, WorkflowCall};

/// A value that can cross the journal: serialized on the way in, rebuilt on the
/// way out.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored in the keiro journal",
    label = "this type must implement `serde::Serialize` and `serde::de::DeserializeOwned`",
    note = "add `#[derive(serde::Serialize, serde::Deserialize)]` to `{Self}`, or use a type that has them"
)]
pub trait JournalValue: serde::Serialize + serde::de::DeserializeOwned {}
impl<T: serde::Serialize + serde::de::DeserializeOwned> JournalValue for T {}

/// Asserts that a workflow argument or return type can be journaled.
pub fn assert_workflow_value<T: JournalValue>() {}

/// Asserts that a step's return type can be journaled.
pub fn assert_step_value<T: JournalValue>() {}

/// Asserts that an argument of a retried step can be cloned for each attempt.
#[diagnostic::on_unimplemented(
    message = "arguments of a retried `#[step]` must be `Clone + Send + 'static`",
    label = "this argument is passed anew to every attempt, so it must be cloneable",
    note = "derive `Clone` for it, or drop `max_attempts`"
)]
pub trait RetryArg: Clone + Send + 'static {}
impl<T: Clone + Send + 'static> RetryArg for T {}

/// Asserts that an argument of a retried step can be cloned for each attempt.
pub fn assert_retry_arg<T: RetryArg>() {}

/// Encodes a workflow's arguments as its stored input.
pub fn encode_args<T: serde::Serialize>(workflow: &'static str, args: &T) -> Result<String> {
    serde_json::to_string(args)
        .map_err(|e| Error::encode(format!("the arguments of workflow `{workflow}`"), e))
}

/// Builds the call a `#[workflow]` fn returns; `A` is the tuple of its
/// argument types, which names its signature with `R`.
pub fn workflow_call<A, R>(name: &'static str, run: RunFn, input: Result<String>) -> WorkflowCall<R>
where
    R: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    WorkflowCall::new(name, run, crate::signature::of::<A, R>, input)
}
