//! The `#[workflow]` and `#[step]` attribute macros of [keiro].
//!
//! Use them through the `keiro` crate (`use keiro::{step, workflow};`), which
//! re-exports them and provides the runtime the generated code calls into.
//!
//! [keiro]: https://docs.rs/keiro

// Layout: `args` parses the attribute arguments, `model` and `check` turn the
// item into a validated `WorkflowFn` / `StepFn` (every rule runs, all errors are
// reported together), `expand` generates the code. On any error the original
// item is emitted unchanged next to the errors.
mod args;
mod check;
mod expand;
mod model;

use proc_macro::TokenStream;

/// Turns an `async fn` into a durable workflow.
///
/// ```ignore
/// use keiro::{step, workflow};
///
/// #[workflow]
/// async fn checkout(order: Order) -> Result<Receipt, ShopError> {
///     let hold = reserve(order.sku.clone(), order.qty).await?;
///     Ok(Receipt { hold })
/// }
///
/// # async fn run(order: Order) -> Result<(), keiro::Error> {
/// let receipt = checkout(order).id("order-42").await?;
/// # Ok(()) }
/// ```
///
/// Calling `checkout(order)` no longer runs the body: it returns a
/// [`keiro::WorkflowCall<R>`](https://docs.rs/keiro) (here
/// `R = Result<Receipt, ShopError>`) to configure with `.id(..)` / `.on(..)` and then
/// await, `.start()` or `.enqueue()`. The workflow is registered at link time under
/// its name, so a resume worker can rebuild the call from the journal alone.
///
/// # Arguments
///
/// - `name = "..."`: the registered name (non-empty). Defaults to the function's
///   name. Renaming a workflow whose instances are still unfinished makes them
///   unknown to the worker, so set `name` explicitly before renaming the function.
///
/// # Requirements
///
/// The function must be a free `async fn` with owned, plainly named arguments:
/// no `self`, no generic or lifetime parameters, no `where` clause, no
/// reference or `impl Trait` argument types, no patterns (`mut x` is fine).
/// Every argument type and the return type must implement `Serialize` and
/// `DeserializeOwned`: arguments are journaled and the result is recorded.
/// When the return type is a `Result` (its last path segment is `Result`),
/// an `Err` completes the workflow as failed.
///
/// # Expansion
///
/// `#[workflow] pub async fn checkout(order: Order) -> R { .. }` expands to roughly:
///
/// ```ignore
/// // The body, unchanged, under a hidden name (non-doc attributes stay here).
/// async fn __keiro_workflow_body_checkout(order: Order) -> R { .. }
///
/// // What the worker calls with the journaled input.
/// fn __keiro_workflow_run_checkout(input: WorkflowInput)
///     -> BoxFuture<'static, Result<WorkflowOutput, keiro::Error>>
/// {
///     Box::pin(async move {
///         let (order,): (Order,) = input.decode()?;
///         let out: R = __keiro_workflow_body_checkout(order).await;
///         WorkflowOutput::encode(&out, /* out.is_err() if R is a Result */ false)
///     })
/// }
///
/// inventory::submit! {
///     WorkflowRegistration::new("checkout", concat!(module_path!(), "::checkout"),
///         __keiro_workflow_run_checkout)
/// }
///
/// /// (the doc comments of the original function)
/// pub fn checkout(order: Order) -> keiro::WorkflowCall<R> {
///     workflow_call::<R>("checkout", __keiro_workflow_run_checkout,
///         encode_args("checkout", &(order,)))
/// }
/// ```
///
/// `#[cfg(..)]` attributes go on every generated item; doc comments and
/// `#[deprecated]` on the public function; lint attributes (`#[allow]`, ...) on
/// both functions (an `#[expect]` becomes `#[allow]` on the public one); every
/// other attribute, such as `#[tracing::instrument]`, on the body.
#[proc_macro_attribute]
pub fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::workflow(args.into(), item.into()).into()
}

/// Makes an `async fn` a journaled step of a workflow.
///
/// ```ignore
/// use keiro::step;
///
/// #[step]
/// async fn reserve(sku: String, qty: u32) -> Result<String, ShopError> { .. }
///
/// #[step(max_attempts = 5, backoff_ms = 200)]
/// async fn email(to: String, body: String) -> Result<(), ShopError> { .. }
/// ```
///
/// Called inside a workflow, a step takes the next sequence number of the run
/// at the moment it is *called* (not when first polled, so `join!` of several
/// steps is deterministic), runs once and journals its result; on replay it
/// returns the journaled result without running. Called outside a workflow it
/// simply runs.
///
/// # Arguments
///
/// - `name = "..."`: the name journaled with the step (non-empty); defaults to
///   the function's name. Replay compares it, so renaming a step that unfinished
///   workflows have already run is detected as non-determinism unless `name`
///   keeps the old one.
/// - `max_attempts = N` (`N >= 1`, default 1): run the body up to `N` times
///   while it returns `Err`; the final `Err` is journaled. Requires a `Result`
///   return type, and every argument must be `Clone` (each attempt gets a copy).
/// - `backoff_ms = M` (default 100 when `max_attempts > 1`): the delay before
///   the first retry, doubled for each further retry. Only allowed together with
///   `max_attempts > 1`: on a step that runs once it would do nothing, so it is
///   rejected rather than silently ignored.
///
/// # Requirements
///
/// The function must be a free `async fn` with owned, plainly named arguments
/// (no `self`, generics, lifetimes, `where` clause, references, `impl Trait`
/// or patterns; `mut x` is fine), its return type must implement `Serialize`
/// and `DeserializeOwned`, and its future must be `Send`.
///
/// # Expansion
///
/// `#[step] async fn reserve(sku: String, qty: u32) -> R { .. }` expands to:
///
/// ```ignore
/// fn reserve(sku: String, qty: u32) -> impl Future<Output = R> + Send {
///     async fn __keiro_step_body(sku: String, qty: u32) -> R { .. }
///     step_once(StepMeta { name: "reserve", max_attempts: 1, backoff_ms: 0 },
///         move || __keiro_step_body(sku, qty))
/// }
/// ```
///
/// With `max_attempts > 1` it calls `step_retry(meta, |r: &R| r.is_err(), move ||
/// __keiro_step_body(sku.clone(), qty.clone()))` instead. The attributes of the
/// original function stay on the outer function.
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::step(args.into(), item.into()).into()
}
