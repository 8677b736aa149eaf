//! The `#[workflow]` and `#[step]` attribute macros of [keiro].
//!
//! Use them through the `keiro` crate (`use keiro::{step, workflow};`), which
//! re-exports them and provides the runtime the generated code calls into.
//!
//! [keiro]: https://docs.rs/keiro

// Layout: `args` parses the attribute arguments, `model` and `check` turn the
// item into a validated `WorkflowFn` / `StepFn` (every rule runs, all errors are
// reported together; `check::determinism` refuses spawns, clock reads, random
// draws, non-durable waits and races, and hash-order iteration in a workflow
// body, except under `#[keiro::nondeterministic_ok]`, which `check::escape`
// removes),
// `expand` generates the code. `diag` builds and collects the errors; on any
// error the original item is emitted unchanged next to them.
mod args;
mod check;
mod diag;
mod expand;
mod fingerprint;
mod model;
mod queue;
mod select;
mod skeleton;

use proc_macro::TokenStream;

/// Turns an `async fn` into a durable workflow.
///
/// ```
/// use keiro::{step, workflow};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize)]
/// struct Order {
///     sku: String,
///     qty: u32,
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct Receipt {
///     hold: String,
/// }
///
/// #[derive(Debug, Serialize, Deserialize)]
/// enum ShopError {
///     OutOfStock,
/// }
///
/// #[step]
/// async fn reserve(sku: String, qty: u32) -> Result<String, ShopError> {
///     if qty == 0 {
///         return Err(ShopError::OutOfStock);
///     }
///     Ok(format!("{sku} x{qty}"))
/// }
///
/// /// Reserves the stock of an order.
/// #[workflow]
/// async fn checkout(order: Order) -> Result<Receipt, ShopError> {
///     let hold = reserve(order.sku.clone(), order.qty).await?;
///     Ok(Receipt { hold })
/// }
///
/// async fn place(order: Order) -> Result<(), keiro::Error> {
///     // `Ok(Err(ShopError))` when the workflow itself failed.
///     let receipt: Result<Receipt, ShopError> = checkout(order).id("order-42").await?;
///     # drop(receipt);
///     Ok(())
/// }
/// # fn main() {}
/// ```
///
/// Calling `checkout(order)` does not run the body: it returns a
/// `keiro::WorkflowCall<R>` (here `R = Result<Receipt, ShopError>`) to configure
/// with `.id(..)` or `.on(..)` and then await, `.start()` or `.enqueue()`. The
/// workflow is registered at link time under its name, so a resume worker can
/// rebuild the call from the journal alone.
///
/// # Arguments
///
/// - `name = "..."`: the registered name (a non-empty string). Defaults to the
///   function's name. Unfinished instances are resumed by name, so set `name`
///   to the old name before renaming a function that has some.
/// - `cron = "..."`: a schedule. Every resume worker linking the workflow
///   runs a scheduler that starts it at each tick of this cron expression
///   (six or seven fields, seconds first: `0 0 2 * * *` is 02:00:00 daily),
///   exactly once across all workers: the tick's instance id is
///   `cron:<name>:<tick in RFC 3339, UTC>`. The workflow takes exactly one
///   argument, the tick time, typed `std::time::SystemTime`. A malformed
///   expression is a compile error on the string. Manage it at run time with
///   `Keiro::schedules`, `pause_schedule`, `resume_schedule`,
///   `trigger_schedule` and `backfill_schedule`; missed ticks follow
///   `ResumeOptions::missed_ticks`.
/// - `timezone = "..."`: the IANA time zone the `cron` expression is read in
///   (default `UTC`), checked at compile time.
///
/// ```no_run
/// use std::time::SystemTime;
///
/// #[keiro::workflow(cron = "0 0 2 * * *", timezone = "Europe/Berlin")]
/// async fn nightly_report(scheduled_at: SystemTime) -> Result<(), String> {
///     let _ = scheduled_at; // 02:00 Berlin time of the night it runs for
///     Ok(())
/// }
/// ```
///
/// # Requirements
///
/// The function must be an `async fn` (free, or associated without `self`)
/// whose arguments are owned values with plain names: no `self`, no generic or lifetime parameters, no `where`
/// clause, no reference or `impl Trait` types, no patterns (`mut x` is fine).
/// Every argument type and the return type must implement `Serialize` and
/// `DeserializeOwned`, which is checked at the type itself, and the body's
/// future must be `Send`. When the return type is a `Result`, however it is
/// named (`Result<T, E>`, `std::result::Result<T, E>`, or an alias such as
/// `type Res<T> = Result<T, MyError>`), an `Err` records the workflow as failed.
///
/// ```compile_fail
/// # use keiro::workflow;
/// #[workflow]
/// async fn greet(name: &str) -> String { // error: arguments must be owned values
///     format!("hello {name}")
/// }
/// # fn main() {}
/// ```
///
/// # Determinism lints
///
/// A workflow is replayed from its journal, so its body must take the same
/// path every time. What would not is a compile error at its span that names
/// the keiro replacement:
///
/// | In the body                                                   | Use instead                                        |
/// |---------------------------------------------------------------|----------------------------------------------------|
/// | `tokio::spawn`, `tokio::task::spawn_blocking`, `spawn_local`, `std::thread::spawn`, `.spawn(fut)` on a `JoinSet` or handle | `keiro::spawn(child_workflow(..))`, `join!` of steps, or a `#[step]` |
/// | `tokio::select!`, `futures::select!`                          | `keiro::select!`                                   |
/// | `tokio::time::sleep`/`sleep_until`, `std::thread::sleep`      | `keiro::sleep`, `keiro::sleep_until`               |
/// | `SystemTime::now()`, `Instant::now()` (any path ending so)    | `keiro::now().await`, or a `#[step]`               |
/// | `rand::random()`, `rand::thread_rng()`, `rand::rng()`         | `keiro::uuid().await`, or a `#[step]`              |
/// | iterating a `HashMap`/`HashSet` binding                       | a `BTreeMap`/`BTreeSet`, or sort first             |
///
/// The scan covers the body's blocks, closures, `async` blocks and the
/// arguments of macros that take expressions (`join!`, `format!`,
/// `keiro::select!` branches); not nested `fn` items or `#[step]`s declared
/// in the body, nor functions the body calls. Paths are read as written:
/// `time::sleep` after `use tokio::time` and `thread::spawn` after
/// `use std::thread` are caught, a bare `sleep(..)` or `spawn(..)` is not
/// (it may be keiro's own). A hash collection is recognised by its binding:
/// a `let` or argument with a `HashMap`/`HashSet` type, or a `let`
/// initialised by `HashMap::new()`, `::with_capacity`, `::from`,
/// `::from_iter`, `::default`, `.collect::<HashSet<_>>()` or `.clone()` of
/// one; iterating means `for .. in m`/`&m`/`&mut m` or `.iter()`, `.keys()`,
/// `.values()`, `.into_iter()` (and their `_mut`/`into_` forms, `.drain()`)
/// on it, unless the elements are collected straight into a
/// `BTreeMap`/`BTreeSet`. Fields, function results and type aliases are not
/// seen. To allow one of these on purpose (a log line, a metric), put
/// [`macro@nondeterministic_ok`] on the statement, `let` or expression.
///
/// ```compile_fail
/// # use keiro::workflow;
/// #[workflow]
/// async fn fan_out(n: u64) -> u64 { // error: `tokio::spawn` inside a `#[workflow]`
///     tokio::spawn(async move { n }).await.unwrap_or(0)
/// }
/// # fn main() {}
/// ```
///
/// ```compile_fail
/// # use keiro::workflow;
/// #[workflow]
/// async fn stamp() -> u64 { // error: `SystemTime::now` inside a `#[workflow]`
///     let now = std::time::SystemTime::now();
///     now.elapsed().map(|d| d.as_secs()).unwrap_or(0)
/// }
/// # fn main() {}
/// ```
///
/// # Expansion
///
/// `#[workflow] pub async fn checkout(order: Order) -> R { .. }` becomes, in
/// outline (the real code names everything through `::keiro::__private` and
/// asserts at each type that it can be journaled):
///
/// ```ignore
/// /// (the doc comments of the original function)
/// pub fn checkout(order: Order) -> keiro::WorkflowCall<R> {
///     // The body, unchanged, under a hidden name.
///     async fn __keiro_workflow_body_checkout(order: Order) -> R { .. }
///
///     // What the worker calls with the journaled input.
///     fn __keiro_workflow_run_checkout(input: WorkflowInput)
///         -> BoxFuture<'static, Result<WorkflowOutput, keiro::Error>>
///     {
///         Box::pin(async move {
///             let (order,): (Order,) = input.decode()?;
///             let out: R = __keiro_workflow_body_checkout(order).await;
///             // `out.is_err()` for any `Result` type, `false` otherwise.
///             let is_err = (&OutcomeProbe(&out)).__keiro_is_err();
///             WorkflowOutput::encode(&out, is_err)
///         })
///     }
///
///     inventory::submit! {
///         WorkflowRegistration::new("checkout", concat!(module_path!(), "::", "checkout"),
///             __keiro_workflow_run_checkout, signature::<(Order,), R>)
///     }
///
///     workflow_call::<(Order,), R>("checkout", __keiro_workflow_run_checkout,
///         encode_args("checkout", &(order,)))
/// }
/// ```
///
/// Keeping the helpers inside the function adds nothing but `checkout` to the
/// namespace, and lets a workflow be an associated function of a type. (As in
/// any nested function, the body cannot refer to `Self`; name the type.)
///
/// Doc comments, `#[cfg]` and `#[deprecated]` go on the public function; lint
/// attributes (`#[allow]`, ...) on both functions, an `#[expect]` becoming
/// `#[allow]` on the public one; any other attribute, such as
/// `#[tracing::instrument]`, on the body.
#[proc_macro_attribute]
pub fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::workflow(args.into(), item.into()).into()
}

/// Makes an `async fn` a journaled step of a workflow.
///
/// ```
/// use keiro::step;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// enum MailError {
///     Unreachable,
/// }
///
/// #[step]
/// async fn reserve(sku: String, qty: u32) -> String {
///     format!("{sku} x{qty}")
/// }
///
/// // Up to 5 runs while it returns `Err`, waiting 200 ms, 400 ms, 800 ms, ... in between.
/// #[step(max_attempts = 5, backoff_ms = 200)]
/// async fn email(to: String, body: String) -> Result<(), MailError> {
///     # drop((to, body));
///     Ok(())
/// }
/// # fn main() {}
/// ```
///
/// Called inside a workflow, a step takes the run's next sequence number at
/// the moment it is *called*, not when first polled, so `join!` of several
/// steps is deterministic; it then runs and journals its result, `Ok` or `Err`.
/// On replay it returns the journaled result without running. Called outside
/// a workflow it simply runs (with its retries).
///
/// # Arguments
///
/// - `name = "..."`: the name journaled with the step (a non-empty string);
///   defaults to the function's name. Replay compares names, so keep the old
///   one in `name` when renaming a step that unfinished workflows have run.
/// - `max_attempts = N` (`N >= 1`, default 1): run the body up to `N` times
///   while it returns `Err`; the last result is journaled. Requires a `Result`
///   return type, and every argument must be `Clone + Send + 'static`: each
///   attempt gets its own copy.
/// - `backoff_ms = M` (default 100 when `max_attempts > 1`): the wait before
///   the first retry, doubled before each further one. Only accepted together
///   with `max_attempts > 1`: on a step that runs once it would do nothing, so
///   it is rejected rather than silently ignored.
/// - `transaction`: the step runs in a transaction on keiro's own database,
///   which it takes as its first argument, `tx: &mut keiro::Transaction<'_>`;
///   callers pass only the other arguments. The step's journal row is written
///   in that transaction, so the application's writes and the step's result
///   commit together or not at all. An `Err` rolls the writes back (the `Err`
///   itself is journaled, or retried per `max_attempts`); a serialization
///   failure or deadlock runs the body again in a new transaction by
///   default, whether keiro meets it or a statement the body runs on
///   `tx.postgres()` / `tx.sqlite()` does. Every argument must be
///   `Clone + Send + 'static`: each run of the body gets its own copy. See
///   `keiro::Transaction`.
///
/// ```
/// use keiro::{step, Transaction};
///
/// #[step(transaction)]
/// async fn debit(tx: &mut Transaction<'_>, order: String, cents: i64) -> Result<i64, String> {
///     // The application's writes go through `tx.postgres()` / `tx.sqlite()`
///     // (see `keiro::Transaction`); keiro's `*_tx` functions take `tx` as well:
///     keiro::send_tx(tx, &order, "debited", &cents).await.map_err(|e| e.to_string())?;
///     Ok(cents)
/// }
/// // In a workflow: `let cents = debit(order_id, 1999).await?;`
/// # fn main() {}
/// ```
///
/// # Requirements
///
/// The function must be an `async fn` (free, or associated without `self`)
/// whose arguments are owned values with plain names (no `self`, generics, lifetimes, `where` clause,
/// references, `impl Trait` or patterns; `mut x` is fine). Its return type
/// must implement `Serialize` and `DeserializeOwned`, which is checked at the
/// type itself, and its future must be `Send`. For `Result<T, E>` as written,
/// `T` and `E` are checked apart, so an error type such as `std::io::Error`
/// is reported as one that cannot be journaled as a step's error (map it to a
/// `String` or a serializable enum).
///
/// ```compile_fail
/// # use keiro::step;
/// #[step(max_attempts = 3)] // error: retries need a `Result` to tell failure from success
/// async fn count(n: u32) -> u32 {
///     n + 1
/// }
/// # fn main() {}
/// ```
///
/// # Expansion
///
/// `#[step] async fn reserve(sku: String, qty: u32) -> R { .. }` becomes, in
/// outline (the real code names everything through `::keiro::__private`):
///
/// ```ignore
/// fn reserve(sku: String, qty: u32) -> impl Future<Output = R> + Send {
///     async fn __keiro_step_body(sku: String, qty: u32) -> R { .. }
///     // Called right away: this is when the sequence number is taken.
///     let step: Pin<Box<dyn Future<Output = R> + Send>> = Box::pin(step_once(
///         StepMeta { name: "reserve", max_attempts: 1, backoff_ms: 0, timeout_ms: None },
///         move || __keiro_step_body(sku, qty),
///     ));
///     step
/// }
/// ```
///
/// With `max_attempts > 1` it calls `step_retry(meta, |r: &R|
/// RetryOutcome::is_err(r), move || __keiro_step_body(sku.clone(), qty.clone()))`
/// instead; `RetryOutcome` is implemented for every `Result`, whatever alias
/// names it, and its absence is reported at the return type. The attributes of
/// the original function stay on the outer function. With `transaction` it
/// calls `step_transaction(meta, is_err, retry, move |tx|
/// Box::pin(__keiro_step_body(tx, account.clone(), cents.clone())))`: keiro
/// runs the closure with the transaction it opened. (The box keeps rustc from
/// reporting an unmet bound of the return type a second time; it costs one
/// allocation per step call.)
#[proc_macro_attribute]
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::step(args.into(), item.into()).into()
}

/// Allows, on purpose, code that the determinism lints of `#[workflow]`
/// refuse: put it on the statement, `let` or expression.
///
/// Inside a `#[workflow]` body (outside nested `fn` items and `#[step]`s) a
/// clock read (`SystemTime::now()`, `Instant::now()`), a random draw
/// (`rand::random()`, `rand::thread_rng()`, `rand::rng()`), a wait or race
/// outside the journal (`tokio::time::sleep`, `std::thread::sleep`,
/// `tokio::select!`), a spawned task, or an iteration over a
/// `HashMap`/`HashSet` is a compile error naming the keiro replacement,
/// because a replay of the journal could take another path. When the value
/// cannot change the workflow's path (a log line, a metric), say so:
///
/// ```
/// use std::time::Instant;
///
/// #[keiro::step]
/// async fn charge(cents: u64) -> u64 {
///     cents
/// }
///
/// #[keiro::workflow]
/// async fn checkout(cents: u64) -> u64 {
///     #[keiro::nondeterministic_ok] // only logged, never decides anything
///     let started = Instant::now();
///     let charged = charge(cents).await;
///     eprintln!("charged in {:?}", started.elapsed());
///     charged
/// }
/// # fn main() {}
/// ```
///
/// `#[workflow]` and `#[step]` remove the attribute from their bodies (Rust
/// accepts no custom attribute on a statement or expression); on any other
/// item it does nothing. It takes no arguments.
#[proc_macro_attribute]
pub fn nondeterministic_ok(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::nondeterministic_ok(args.into(), item.into()).into()
}

/// Races keiro futures durably: the first branch to complete wins, and its
/// index is journaled, so every replay of the workflow takes the same branch
/// (the others are dropped; a losing step stops at its next await, and a
/// result it journaled anyway is kept, never re-run, and ignored).
///
/// Each branch is `<pattern> = <keiro future> => <handler>`: a `#[step]`
/// call, `keiro::sleep`, an awakeable, `keiro::recv`, a child workflow call
/// or a `ChildHandle` (and their `.timeout(..)`s). Long waits suspend the
/// workflow until the first of them is due. Outside a workflow it is a plain
/// race (the first to complete, polled in order).
///
/// ```no_run
/// use std::time::Duration;
///
/// #[keiro::step]
/// async fn charge(cents: u64) -> Result<String, String> {
///     Ok(format!("charged {cents}"))
/// }
///
/// #[keiro::workflow]
/// async fn pay(cents: u64) -> Result<String, String> {
///     keiro::select! {
///         receipt = charge(cents) => receipt,
///         cancel = keiro::recv::<String>("cancel") => {
///             Err(format!("cancelled: {}", cancel.map_err(|e| e.to_string())?))
///         }
///         _ = keiro::sleep(Duration::from_secs(30)) => Err("the charge took too long".into()),
///     }
/// }
/// ```
#[proc_macro]
pub fn select(input: TokenStream) -> TokenStream {
    expand::select(input.into()).into()
}

/// Declares a queue: `static NAME: keiro::Queue`, registered at link time
/// like a workflow, for [`WorkflowCall::queue`](../keiro/struct.WorkflowCall.html#method.queue).
///
/// ```ignore
/// use std::time::Duration;
/// keiro::queue!(PAYMENTS = "payments", concurrency = 10, worker_concurrency = 2,
///               rate_limit = (100, Duration::from_secs(60)));
/// ```
///
/// Every setting is optional (none: no limit) and holds per partition key:
/// `concurrency` (`u32`) running at once across all workers,
/// `worker_concurrency` (`u32`) running at once in one worker process, and
/// `rate_limit` (`(u32, Duration)`) starts within any window of that length.
/// A blank name (or one with a NUL byte, or over `keiro::MAX_ID_BYTES`), a
/// literal 0 or negative count, a `rate_limit` not written `(starts,
/// period)` or with a zero period, a `worker_concurrency` above
/// `concurrency`, and an unknown or repeated setting are compile errors at
/// the offending tokens; the same mistakes in values the macro cannot see
/// (constants), and one name declared twice with other settings, are
/// `keiro::Error::InvalidOption` when the runtime connects (a
/// `worker_concurrency` above `concurrency` there only a warning).
#[proc_macro]
pub fn queue(input: TokenStream) -> TokenStream {
    expand::queue(input.into()).into()
}
