//! Testing workflows: [`replay`] a production history against the current
//! code, with no side effects.

mod replay;

pub use replay::{replay, ReplayTarget};
