//! Support for the code `#[workflow]` and `#[step]` generate. Not a public API.

pub use inventory;

pub use crate::context::{branch, BranchFuture, Durable, DurableFuture, Select};
pub use crate::context::{step_once, step_retry, step_transaction, StepMeta};
pub use crate::queue::QueueRegistration;
pub use crate::registry::{
    BoxFuture, RunFn, SignatureFn, WorkflowInput, WorkflowOutput, WorkflowRegistration,
};
pub use crate::schedule::CronRegistration;
pub use crate::signature::of as signature;

use crate::{Result, WorkflowCall};

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

/// The argument of a `#[workflow(cron = "..")]`: the tick, as
/// `std::time::SystemTime` (the macro sees only the type's name, so another
/// type named `SystemTime` is caught here).
#[diagnostic::on_unimplemented(
    message = "a `cron` workflow's argument is the tick it runs for, a `std::time::SystemTime`; `{Self}` is another type",
    label = "take `scheduled_at: std::time::SystemTime` here"
)]
pub trait CronTick {}
impl CronTick for std::time::SystemTime {}

/// Asserts that a cron workflow's argument is `std::time::SystemTime`.
pub fn assert_cron_tick<T: CronTick>() {}

/// A step's error type: journaled like any value, but named as an error so a
/// foreign error type (`std::io::Error`) gets advice that fits it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be journaled as a step's error",
    label = "this error type must implement `serde::Serialize` and `serde::de::DeserializeOwned`",
    note = "map it to a type that can be journaled: `.map_err(|e| e.to_string())` and return `Result<T, String>`, \
            or your own error enum with `#[derive(serde::Serialize, serde::Deserialize)]`"
)]
pub trait StepError: serde::Serialize + serde::de::DeserializeOwned {}
impl<T: serde::Serialize + serde::de::DeserializeOwned> StepError for T {}

/// `T` itself. Generated code names a type through it to give one-token
/// types (`Hold`) a span covering several tokens.
pub type Same<T> = T;

/// Asserts that the error type of a step returning `Result<T, E>` can be journaled.
pub fn assert_step_error<E: StepError>() {}

/// What a retried step returns: a `Result`, whatever alias or path names it,
/// so that an `Err` can be told from success.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `Result`, so `#[step(max_attempts = ..)]` cannot tell a failed attempt from a successful one",
    label = "`max_attempts` retries a step on `Err`, so this must be a `Result`",
    note = "return `Result<T, E>` (or an alias of it), or remove `max_attempts`"
)]
pub trait RetryOutcome {
    /// The error of a failed attempt.
    type Error;
    /// Whether this attempt failed and may be retried.
    fn is_err(&self) -> bool;
    /// The error of a failed attempt.
    fn error(&self) -> Option<&Self::Error>;
}

impl<T, E> RetryOutcome for core::result::Result<T, E> {
    type Error = E;
    fn is_err(&self) -> bool {
        core::result::Result::is_err(self)
    }
    fn error(&self) -> Option<&E> {
        self.as_ref().err()
    }
}

/// `#[step(retry_if = predicate)]`: whether a failed attempt is retried (the
/// predicate says so of its error); a success is never retried.
pub fn retry_if<R: RetryOutcome>(outcome: &R, predicate: fn(&R::Error) -> bool) -> bool {
    outcome.error().is_some_and(predicate)
}

/// Asserts that a retried step returns a `Result`.
pub fn assert_retry_outcome<R: RetryOutcome>() {}

/// The error type of a step with `timeout_ms`: it can say that an attempt
/// ran out of time.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot report a step timeout: `#[step(timeout_ms = ..)]` needs the step's error type to implement `From<keiro::StepTimeout>`",
    label = "`timeout_ms` ends a slow attempt with `Err(keiro::StepTimeout.into())`",
    note = "add `impl From<keiro::StepTimeout> for {Self}` (e.g. into a `Timeout` variant), return `Result<T, String>` (`String` has it), or remove `timeout_ms`"
)]
pub trait TimeoutError: From<crate::StepTimeout> {}
impl<E: From<crate::StepTimeout>> TimeoutError for E {}

/// What a step with `timeout_ms` returns, when its type is an alias the
/// macro cannot take apart: a `Result` whose error can say the attempt ran
/// out of time.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot report a step timeout: `#[step(timeout_ms = ..)]` needs a `Result<T, E>` whose `E: From<keiro::StepTimeout>`",
    label = "`timeout_ms` ends a slow attempt with `Err(keiro::StepTimeout.into())`",
    note = "return `Result<T, E>` with `impl From<keiro::StepTimeout> for E` (`String` has it), or remove `timeout_ms`"
)]
pub trait TimeoutOutcome {
    /// The outcome of an attempt that ran out of time.
    fn timed_out(timeout: crate::StepTimeout) -> Self;
}

impl<T, E: From<crate::StepTimeout>> TimeoutOutcome for core::result::Result<T, E> {
    fn timed_out(timeout: crate::StepTimeout) -> Self {
        Err(E::from(timeout))
    }
}

/// How a step returning `Result<T, E>` reports a timeout (checked at the
/// `timeout_ms` attribute, the one place an unfit `E` is reported).
pub fn timeout_into<T, E: TimeoutError>() -> fn(crate::StepTimeout) -> core::result::Result<T, E> {
    |timeout| Err(E::from(timeout))
}

/// Like [`timeout_into`] for a return type named through an alias.
pub fn timeout_outcome<R: TimeoutOutcome>() -> fn(crate::StepTimeout) -> R {
    R::timed_out
}

/// Runs one attempt of step `step` for at most `ms` milliseconds; an attempt
/// that overruns is dropped (it stops at its next await) and ends as
/// `timed_out` says.
pub async fn with_timeout<R>(
    ms: u64,
    step: &'static str,
    timed_out: fn(crate::StepTimeout) -> R,
    attempt: impl core::future::Future<Output = R>,
) -> R {
    let limit = std::time::Duration::from_millis(ms);
    match tokio::time::timeout(limit, attempt).await {
        Ok(outcome) => outcome,
        Err(_) => timed_out(crate::StepTimeout { step, limit }),
    }
}

/// The output of a workflow, probed by autoref specialization: the generated
/// code calls `(&OutcomeProbe(&out)).__keiro_is_err()` with [`ResultOutcome`] and
/// [`PlainOutcome`] in scope. For any `Result` (through any alias or path) the
/// by-value candidate, [`ResultOutcome`], applies and reports `is_err()`; for
/// every other type only the autoref candidate, [`PlainOutcome`], does, and
/// reports `false`. This works because the expansion names a concrete type.
pub struct OutcomeProbe<'a, T>(pub &'a T);

/// The `Result` case of [`OutcomeProbe`].
pub trait ResultOutcome {
    /// Whether the workflow's output is an `Err`.
    fn __keiro_is_err(&self) -> bool;
}

impl<T, E> ResultOutcome for OutcomeProbe<'_, core::result::Result<T, E>> {
    fn __keiro_is_err(&self) -> bool {
        self.0.is_err()
    }
}

/// The fallback of [`OutcomeProbe`]: any output that is not a `Result` succeeded.
pub trait PlainOutcome {
    /// Always `false`.
    fn __keiro_is_err(&self) -> bool;
}

impl<T> PlainOutcome for &OutcomeProbe<'_, T> {
    fn __keiro_is_err(&self) -> bool {
        false
    }
}

/// Asserts that an argument of a transactional step can be cloned for each
/// run of its body.
#[diagnostic::on_unimplemented(
    message = "arguments of a `#[step(transaction)]` must be `Clone + Send + 'static`",
    label = "this argument is passed anew to every run of the body (a conflict with another transaction runs it again), so it must be cloneable",
    note = "derive `Clone` for it, or pass an owned type that has it"
)]
pub trait TransactionArg: Clone + Send + 'static {}
impl<T: Clone + Send + 'static> TransactionArg for T {}

/// Asserts that an argument of a transactional step can be cloned for each
/// run of its body.
pub fn assert_transaction_arg<T: TransactionArg>() {}

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
    crate::json::to_json(args, || {
        format!("the arguments of workflow `{workflow}` hold")
    })
}

/// Builds the call a `#[workflow]` fn returns; `A` is the tuple of its
/// argument types, which names its signature with `R`.
pub fn workflow_call<A, R>(name: &'static str, run: RunFn, input: Result<String>) -> WorkflowCall<R>
where
    R: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    WorkflowCall::new(name, run, crate::signature::of::<A, R>, input)
}
