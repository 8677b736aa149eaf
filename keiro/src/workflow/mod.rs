//! Workflow instances: calling one ([`WorkflowCall`]), watching one
//! ([`WorkflowHandle`]), driving one in this process, children, and ending one
//! early (cancel, continue-as-new).

mod call;
pub(crate) mod child;
pub(crate) mod drive;
mod handle;
mod lifecycle;

pub use call::WorkflowCall;
pub use child::{spawn, ChildHandle};
pub use handle::{handle, WorkflowHandle, WorkflowStatus};
pub use lifecycle::{cancel, continue_as_new, CancelOutcome};
