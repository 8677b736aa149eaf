//! Testing workflows: [`replay`] a production history against the current
//! code with no side effects, and [`TestEnv`], an isolated runtime on a
//! private in-memory SQLite database whose clock moves only when the test
//! says so. Both run on the embedded SQLite backend (feature `sqlite`).

#[cfg(feature = "sqlite")]
mod env;
#[cfg(feature = "sqlite")]
mod replay;

#[cfg(feature = "sqlite")]
pub use env::TestEnv;
#[cfg(feature = "sqlite")]
pub use replay::{replay, ReplayTarget};
