//! Workflow instances: calling one ([`WorkflowCall`]), watching one
//! ([`WorkflowHandle`]), launching and following one (`launch.rs`), driving
//! its body (`drive.rs`) and recording how it ended (`end.rs`), children, and
//! ending one early (cancel, continue-as-new).

mod call;
pub(crate) mod child;
pub(crate) mod drive;
pub(crate) mod end;
mod handle;
mod lapsed_lease;
pub(crate) mod launch;
mod lifecycle;
mod operate;

pub use call::WorkflowCall;
pub use child::{spawn, ChildHandle, ChildTimeout};
pub use handle::{handle, WorkflowHandle, WorkflowStatus};
pub use lifecycle::{cancel, continue_as_new, CancelOutcome};
pub use operate::{fork, retry, ForkCall, ForkFrom};
