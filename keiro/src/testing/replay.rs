//! [`replay`]: a history against the current code of its workflow, in a
//! test.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::history::replay::Replayer;
use crate::history::{History, ReplayError, Replayed};
use crate::{Error, WorkflowCall};

/// A `#[workflow]` fn, as [`replay`] takes it: the public fn the macro
/// generates, `fn name(args..) -> WorkflowCall<R>`, of any arity up to 12.
/// Implemented for every such fn; there is nothing to implement by hand.
pub trait ReplayTarget<Args> {
    /// What the workflow returns.
    type Output;

    /// Builds the call with `args` (runs nothing).
    fn call_with(&self, args: Args) -> WorkflowCall<Self::Output>;
}

macro_rules! replay_target {
    ($($arg:ident),*) => {
        impl<F, R, $($arg),*> ReplayTarget<($($arg,)*)> for F
        where
            F: Fn($($arg),*) -> WorkflowCall<R>,
        {
            type Output = R;

            #[allow(non_snake_case, clippy::unused_unit)]
            fn call_with(&self, ($($arg,)*): ($($arg,)*)) -> WorkflowCall<R> {
                self($($arg),*)
            }
        }
    };
}

replay_target!();
replay_target!(A1);
replay_target!(A1, A2);
replay_target!(A1, A2, A3);
replay_target!(A1, A2, A3, A4);
replay_target!(A1, A2, A3, A4, A5);
replay_target!(A1, A2, A3, A4, A5, A6);
replay_target!(A1, A2, A3, A4, A5, A6, A7);
replay_target!(A1, A2, A3, A4, A5, A6, A7, A8);
replay_target!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
replay_target!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
replay_target!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
replay_target!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);

/// Runs the current code of `workflow` against `history` with no side
/// effects, and fails with the same expected/found diff as
/// [`WorkflowStatus::NonDeterministic`](crate::WorkflowStatus::NonDeterministic)
/// when the code would diverge from it.
///
/// Step bodies never run: journaled results come back as recorded. When the
/// code reaches a point the history has not recorded (a step it would run,
/// a child it would start, a wait the history does not answer), the replay
/// stops there and passes ([`ReplayStop::HistoryEnd`](crate::ReplayStop::HistoryEnd)).
/// When it calls something else than the history recorded at a position,
/// or returns before reaching every recorded entry, it fails with
/// [`ReplayError::Diverged`]. A history of another workflow is
/// [`ReplayError::OtherWorkflow`]; an input or recorded result that no
/// longer decodes, or a panic, is [`ReplayError::Failed`].
///
/// It needs no database: the history is imported into a private in-memory
/// SQLite runtime, where anything else the code writes (a message, an
/// event) stays. Keep production histories (`keiro show ID --history`) as
/// test fixtures, and `cargo test` catches a change that would break
/// instances in flight:
///
/// ```no_run
/// # mod shop {
/// #[keiro::step]
/// async fn reserve(sku: String) -> Result<String, String> { Ok(sku) }
///
/// #[keiro::workflow]
/// pub async fn checkout(sku: String, qty: u32) -> Result<String, String> {
///     reserve(sku).await
/// }
/// # }
///
/// // In tests/histories.rs: `#[tokio::test] async fn ..()`.
/// async fn checkout_still_replays_production_histories() {
///     let text = std::fs::read_to_string("tests/histories/order-42.json").unwrap();
///     let history = keiro::History::from_json(&text).unwrap();
///     keiro::testing::replay(&history, shop::checkout).await.unwrap();
/// }
/// ```
pub async fn replay<Args, W>(history: &History, workflow: W) -> Result<Replayed, ReplayError>
where
    W: ReplayTarget<Args>,
    W::Output: Serialize + DeserializeOwned + Send + 'static,
    Args: DeserializeOwned,
{
    let args: Args = serde_json::from_str(history.input.get()).map_err(|e| {
        let what = format!(
            "the input of the history of workflow `{}` (id {}) into the argument types of the \
             workflow replayed against it (is it that workflow's history?)",
            history.workflow, history.id
        );
        ReplayError::failed(history, Error::decode(what, e))
    })?;
    let call = workflow.call_with(args);
    let replayer = Replayer::new()
        .await
        .map_err(|e| ReplayError::failed(history, e))?;
    let replayed = replayer.replay(history, call.name, call.run).await;
    replayer.close().await;
    replayed
}
