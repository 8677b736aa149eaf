//! How the store's statements are prepared on PostgreSQL.
//!
//! By default sqlx prepares each statement once per connection under a name
//! (`sqlx_s_1`, ..) and keeps it. Behind a transaction-pooling proxy
//! (pgbouncer in `pool_mode = transaction`, RDS Proxy, ..) consecutive
//! transactions of one client connection run on different server
//! connections, so a kept name is missing on the next one, or already taken
//! there by another client. Once a store is opened with
//! [`Pooler::Transaction`](crate::Pooler::Transaction), every statement this
//! crate sends to PostgreSQL from then on is prepared unnamed, which the
//! server forgets at the end of the transaction it ran in. The switch is per
//! process: a direct store in the same process then prepares unnamed
//! statements too (one more round trip per statement, no change in results).
//! SQLite statements are always cached.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::database::HasStatementCache;
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{Database, FromRow};

/// Whether PostgreSQL statements are prepared unnamed.
static UNNAMED: AtomicBool = AtomicBool::new(false);

/// Prepares every later PostgreSQL statement of this process unnamed.
#[cfg(feature = "postgres")]
pub(crate) fn prepare_unnamed() {
    UNNAMED.store(true, Ordering::Relaxed);
}

/// Whether a statement for `DB` is kept prepared on its connection.
fn persistent<DB: Database>() -> bool {
    DB::NAME != "PostgreSQL" || !UNNAMED.load(Ordering::Relaxed)
}

/// [`sqlx::query`], kept prepared unless [`prepare_unnamed`] was called.
pub(crate) fn query<DB: Database + HasStatementCache>(
    sql: &str,
) -> Query<'_, DB, DB::Arguments<'_>> {
    sqlx::query(sql).persistent(persistent::<DB>())
}

/// A query built otherwise (a `QueryBuilder`'s), kept prepared unless
/// [`prepare_unnamed`] was called.
pub(crate) fn built<'q, DB, A>(query: Query<'q, DB, A>) -> Query<'q, DB, A>
where
    DB: Database + HasStatementCache,
    A: sqlx::IntoArguments<'q, DB>,
{
    query.persistent(persistent::<DB>())
}

/// [`sqlx::query_as`], kept prepared unless [`prepare_unnamed`] was called.
pub(crate) fn query_as<'q, DB, O>(sql: &'q str) -> QueryAs<'q, DB, O, DB::Arguments<'q>>
where
    DB: Database + HasStatementCache,
    O: for<'r> FromRow<'r, DB::Row>,
{
    sqlx::query_as(sql).persistent(persistent::<DB>())
}

/// [`sqlx::query_scalar`], kept prepared unless [`prepare_unnamed`] was
/// called.
pub(crate) fn query_scalar<'q, DB, O>(sql: &'q str) -> QueryScalar<'q, DB, O, DB::Arguments<'q>>
where
    DB: Database + HasStatementCache,
    (O,): for<'r> FromRow<'r, DB::Row>,
{
    sqlx::query_scalar(sql).persistent(persistent::<DB>())
}
