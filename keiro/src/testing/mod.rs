//! Testing workflows: [`TestEnv`], an isolated runtime on a private in-memory
//! SQLite database whose clock moves only when the test says so.

#[cfg(feature = "sqlite")]
mod env;
#[cfg(feature = "sqlite")]
pub use env::TestEnv;
