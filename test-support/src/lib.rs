//! What keiro's test suites and its benchmark share to get a database of their
//! own on the PostgreSQL server an environment variable names.
//!
//! - [`PostgresServer::from_env`] reads the server's URL from a variable such
//!   as [`TEST_POSTGRES_URL_VAR`] (unset or empty: [`DEFAULT_POSTGRES_URL`],
//!   the local server over its Unix socket as the current OS user).
//! - [`PostgresServer::create_database`] makes a fresh, empty
//!   `<prefix><uuid>` database there and returns its name and URL;
//!   [`PostgresServer::drop_database`] drops it again.
//! - [`with_database`] rewrites a URL to name another database, and
//!   [`redact_url`] (keiro-store's own) hides the password of a URL that goes
//!   into a message.
//!
//! An unreachable server is an error naming the variable: a PostgreSQL test is
//! never skipped silently.

mod pgbouncer;
mod postgres;
mod url;

pub use keiro_store::redact_url;
pub use pgbouncer::PgBouncer;
pub use postgres::{PostgresDatabase, PostgresError, PostgresServer};
pub use url::with_database;

/// The variable naming the PostgreSQL server keiro's tests use.
pub const TEST_POSTGRES_URL_VAR: &str = "KEIRO_TEST_POSTGRES_URL";

/// The server used when the variable is unset or empty: the local one over its
/// Unix socket, as the current OS user.
pub const DEFAULT_POSTGRES_URL: &str = "postgres:///keiro_test";

/// The prefix of every test database (`.ci/run` drops the `keiro_t_%` ones an
/// earlier run left behind).
pub const TEST_DATABASE_PREFIX: &str = "keiro_t_";
