//! # keiro: durable execution for Rust, as a library
//!
//! Mark plain `async fn`s with [`#[workflow]`](workflow) and [`#[step]`](step);
//! keiro journals every step's result in a database, so a workflow that
//! crashes or is redeployed picks up exactly where it stopped. The journal is
//! a table in SQLite (the embedded default) or PostgreSQL.
//!
//! ```no_run
//! use keiro::{step, workflow};
//!
//! #[step]
//! async fn reserve(sku: String, qty: u32) -> Result<String, String> {
//!     Ok(format!("hold-{sku}-{qty}"))
//! }
//!
//! #[step(max_attempts = 5, backoff_ms = 200)]
//! async fn charge(amount: u64) -> Result<u64, String> {
//!     Ok(amount)
//! }
//!
//! #[workflow]
//! async fn checkout(sku: String, qty: u32) -> Result<String, String> {
//!     let hold = reserve(sku, qty).await?;
//!     charge(42).await?;
//!     Ok(hold)
//! }
//!
//! # async fn demo() -> Result<(), keiro::Error> {
//! // Uses KEIRO_DATABASE_URL, else the SQLite file keiro.db.
//! let receipt = checkout("apple".into(), 3).id("order-42").await?;
//! assert_eq!(receipt, Ok("hold-apple-3".to_string()));
//! # Ok(()) }
//! ```
//!
//! * A step's id is its sequence number in the run, taken when the step is
//!   *called*, so `tokio::join!` of steps is deterministic.
//! * Re-running a workflow id replays journaled steps without running them; a
//!   finished id returns its stored output.
//! * If the code calls a different step where the journal recorded another,
//!   the instance is set aside ([`WorkflowStatus::NonDeterministic`]) with its
//!   journal untouched; [`Keiro::resume`] puts it back once the code is fixed.
//! * [`now`] and [`uuid()`] are journaled, so a replay sees the first run's values.
//! * `#[step(transaction)]` runs a step in a [`Transaction`] on keiro's own
//!   database and writes its journal row in it: the application's writes and
//!   the step's result commit together, exactly once.
//! * With the cargo feature `otel`, the OpenTelemetry trace of the span that
//!   starts or enqueues a workflow goes on in every run of it, in whichever
//!   process: its `traceparent` is stored with the instance
//!   ([`WorkflowSummary::traceparent`]) and becomes the parent of the run's
//!   `keiro.workflow` span (`tracing-opentelemetry`; see the
//!   `trace_two_processes` example).

#![forbid(unsafe_code)]

#[cfg(feature = "admin")]
pub mod admin;
mod check;
mod context;
mod debounce;
mod error;
mod hash_check;
mod history;
pub mod inspect;
mod journal_mode;
mod json;
mod operate;
mod panic;
mod queue;
mod registry;
mod resume;
mod retention;
mod retry;
mod runtime;
mod schedule;
mod shutdown;
mod signature;
pub mod telemetry;
pub mod testing;
mod time;
pub mod timers;
mod trace;
mod transaction;
pub mod unstable;
mod version;
mod workflow;

#[doc(hidden)]
pub mod __private;

pub use journal_mode::Journal;
#[doc(inline)]
pub use keiro_macros::queue;
#[doc(inline)]
pub use keiro_macros::{step, workflow};
pub use queue::Queue;

#[doc(inline)]
pub use keiro_macros::select;

#[doc(inline)]
pub use keiro_macros::nondeterministic_ok;

pub use check::{check, CheckReport, Unregistered};
pub use context::{
    awakeable, close_stream, get_event, now, read_stream, recv, reject_awakeable,
    resolve_awakeable, resolve_awakeable_tx, send, send_tx, set_event, sleep, sleep_until, uuid,
    write_stream, Awakeable, GetEvent, Recv, RecvTimeout, Sending, StepTimeout, StreamReader,
};
pub use context::{deprecate_patch, patched, MAX_PATCH_ID_BYTES};
pub use context::{AwakeableTimeout, DurableFuture};
pub use error::{Error, Result, StoreError, TypeMismatch};
pub use hash_check::{
    binary_hashes, BinaryHashes, HashCheckReport, HashMismatch, HashMismatchReason,
};
pub use history::{
    Divergence, History, HistoryEntry, HistoryError, ReplayError, ReplayStop, Replayed,
    HISTORY_FORMAT,
};
pub use keiro_store::GcSummary;
pub use keiro_store::{Pooler, SqliteSynchronous, MAX_ID_BYTES};
pub use operate::{
    list, ListFilter, Page, StepOutcome, StepRecord, WaitKind, WaitingOn, WorkflowSummary, MAX_PAGE,
};
pub use retention::{gc, Retention, MAX_GC_BATCH};
pub use runtime::{
    global, init, Keiro, KeiroBuilder, DATABASE_URL_ENV, DEFAULT_DATABASE_URL,
    DEFAULT_MAX_PAYLOAD_BYTES, EXECUTOR_ID_ENV, LISTEN_URL_ENV, SQLITE_SYNCHRONOUS_ENV,
};
pub use schedule::{MissedTicks, ScheduleInfo, DEFAULT_TIMEZONE, MAX_BACKFILL_TICKS};
pub use transaction::{Transaction, TxConnection};
pub use uuid::Uuid;
pub use version::{VersionCount, APP_VERSION_ENV, MAX_APP_VERSION_BYTES};
pub use workflow::{
    cancel, continue_as_new, handle, spawn, CancelOutcome, ChildHandle, ChildTimeout, WorkflowCall,
    WorkflowHandle, WorkflowStatus,
};
pub use workflow::{fork, retry, ForkCall, ForkFrom};

/// Keeps the workflows of crates this binary depends on but never names.
///
/// Workflows register at link time. A library crate of workflows that the
/// worker's code never mentions is not linked at all, so its workflows are
/// silently missing: instances of them stay pending, and the worker's start-up
/// log (at `info`) does not list them. Name each such crate once, in the
/// binary's `main.rs`:
///
/// ```ignore
/// keiro::link!(shop_workflows, billing_workflows);
///
/// #[tokio::main]
/// async fn main() -> Result<(), keiro::Error> {
///     let worker = keiro::run_resume_worker().await?; // serves shop's and billing's workflows
///     # worker.shutdown().await;
///     Ok(())
/// }
/// ```
///
/// It expands to `use shop_workflows as _;` per crate, which is all the
/// linker needs. A crate the binary already calls into needs nothing.
#[macro_export]
macro_rules! link {
    ($($krate:ident),+ $(,)?) => {
        $(
            #[allow(unused_imports)]
            use $krate as _;
        )+
    };
}
pub use resume::{
    run_resume_worker, ResumeEvent, ResumeLog, ResumeOptions, ResumeSummary, ResumeWorker,
};
