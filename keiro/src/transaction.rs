//! [`Transaction`]: the transaction a `#[step(transaction)]` runs in, on
//! keiro's own database.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt as _};
use keiro_store::{StepTx, TimerTx};

/// A transaction on keiro's own database, handed to a
/// [`#[step(transaction)]`](crate::step) as its first argument.
///
/// keiro opens it, runs the step's body with it, writes the step's journal
/// row in it and commits: the application's writes and the step's result
/// commit together or not at all, so the step takes effect exactly once,
/// even when the process is killed between the writes and the commit.
///
/// The body runs ordinary sqlx queries on the backend in use:
/// [`Transaction::postgres`] and [`Transaction::sqlite`] give the
/// transaction's connection as a [`TxConnection`] (`None` on the other
/// backend), an [`sqlx::Executor`]: pass `&mut conn` to sqlx queries. A body
/// written for one backend `expect`s its connection; one that serves both
/// matches on them; [`Transaction::backend`] says which it is. Pass the
/// `Transaction` itself to keiro's `*_tx` functions ([`crate::send_tx`],
/// [`crate::resolve_awakeable_tx`], [`crate::timers::schedule_tx`]): they
/// then commit with the step.
///
/// An `Err` from the body rolls its writes back; the `Err` is then journaled
/// like any step's (in a small transaction of its own), or the body runs
/// again in a new transaction per `max_attempts`. On replay the journaled
/// result is returned and no transaction is opened. Called outside a
/// workflow, the body runs in a transaction of the process-wide runtime
/// ([`crate::global`]), committed on success, and nothing is journaled;
/// a conflict, or a connection lost before the `COMMIT`, runs the body
/// again, and an error keiro cannot get past panics, naming the step (a
/// `COMMIT` that met a lost connection or a server shutting down among
/// them: nothing says whether it committed).
///
/// A serialization failure or deadlock that a statement of the body meets
/// (PostgreSQL's SQLSTATE `40001` or `40P01`) runs the step again by default:
/// keiro sees it on the [`TxConnection`], rolls back and runs the body again
/// in a new transaction, whatever the body returned, outside the
/// `max_attempts` count, like a conflict keiro meets itself (beginning,
/// writing the journal row, committing). After 50 in a row the run stops
/// and is resumed later. Statements run on the sqlx transaction itself
/// ([`Transaction::as_postgres`], [`Transaction::as_sqlite`]) bypass keiro:
/// their conflicts are only the body's `Err` (classify them with
/// [`Transaction::is_conflict`] and retry with `retry_if`).
///
/// On PostgreSQL a statement that fails aborts the transaction: a body that
/// swallows such an error and returns `Ok` cannot commit, and its run stops
/// with [`crate::Error::TransactionAborted`], naming the statement that
/// failed when it ran through [`Transaction::postgres`]. Return the error,
/// or run a statement that may fail inside a `SAVEPOINT` and roll back to
/// it.
///
/// Never commit, roll back or replace the sqlx transaction in the body (keiro
/// commits it once the journal row is written): keiro checks, before it
/// writes the row, that the body left the transaction open, and fails the
/// instance with [`crate::Error::TransactionEnded`] when it did not. Never
/// wait on another
/// keiro call that writes outside it: on SQLite this transaction holds the
/// database's one write lock until the step ends.
///
/// PostgreSQL (here the application's tables live beside keiro's schema):
///
/// ```no_run
/// use keiro::{step, workflow, Transaction};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// enum BankError {
///     Insufficient,
///     Db(String),
/// }
///
/// impl From<sqlx::Error> for BankError {
///     fn from(e: sqlx::Error) -> Self {
///         BankError::Db(e.to_string())
///     }
/// }
///
/// /// Takes `cents` from `account`; returns the new balance.
/// #[step(transaction)]
/// async fn debit(tx: &mut Transaction<'_>, account: i64, cents: i64) -> Result<i64, BankError> {
///     let mut db = tx.postgres().expect("this service runs on PostgreSQL");
///     // A deadlock or serialization failure here runs the step again.
///     let balance: i64 = sqlx::query_scalar(
///         "UPDATE accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance",
///     )
///     .bind(cents)
///     .bind(account)
///     .fetch_one(&mut db)
///     .await?;
///     if balance < 0 {
///         // An `Err` rolls the update back; the `Err` itself is journaled.
///         return Err(BankError::Insufficient);
///     }
///     Ok(balance)
/// }
///
/// #[workflow]
/// async fn pay(account: i64, cents: i64) -> Result<i64, BankError> {
///     debit(account, cents).await // the call site passes the other arguments
/// }
/// # fn main() {}
/// ```
///
/// SQLite, or either backend from one body:
///
/// ```no_run
/// use keiro::{step, Transaction};
///
/// #[step(transaction)]
/// async fn record(tx: &mut Transaction<'_>, order: String) -> Result<(), String> {
///     let insert = "INSERT INTO shipped (order_id) VALUES ($1)"; // both accept `$1`
///     let done = if let Some(mut db) = tx.sqlite() {
///         sqlx::query(insert).bind(&order).execute(&mut db).await.map(drop)
///     } else if let Some(mut db) = tx.postgres() {
///         sqlx::query(insert).bind(&order).execute(&mut db).await.map(drop)
///     } else {
///         unreachable!("keiro runs on SQLite or PostgreSQL")
///     };
///     done.map_err(|e| e.to_string())
/// }
/// # fn main() {}
/// ```
#[derive(Debug)]
pub struct Transaction<'c> {
    tx: StepTx<'c>,
    /// The conflict the last failed statement run through a [`TxConnection`]
    /// met (the database's message), unless a statement succeeded since:
    /// the step then runs again, whatever its body returned.
    conflict: Option<String>,
    /// The first error a statement run through a [`TxConnection`] returned
    /// since the last that succeeded: on PostgreSQL the statement that
    /// aborted the transaction, named when a body that swallowed it
    /// returns `Ok`.
    failed: Option<String>,
    /// Whether a rollback keiro finds may be SQLite's own at a failed
    /// statement of the body, with nothing committed since (see
    /// [`SqliteRollback`]).
    sqlite_rollback: SqliteRollback,
}

/// What the body's statements say of a rollback SQLite may have made by
/// itself under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqliteRollback {
    /// No statement on the watched connection failed with an error after
    /// which SQLite rolls back by itself.
    NotMet,
    /// One did, and no statement has succeeded since, nor did the body take
    /// the unwatched transaction: a rollback found now is SQLite's, and
    /// nothing the body ran after it committed.
    Met,
    /// One did, and then the body went on (a statement succeeded, in
    /// autocommit if the transaction had rolled back, or it took the
    /// unwatched transaction): a rollback found now may have writes after
    /// it that committed on their own.
    WentOn,
}

impl<'c> Transaction<'c> {
    pub(crate) fn new(tx: StepTx<'c>) -> Self {
        Transaction {
            tx,
            conflict: None,
            failed: None,
            sqlite_rollback: SqliteRollback::NotMet,
        }
    }

    /// Whether a rollback found under the body is SQLite's own at a failed
    /// statement of the body, with nothing the body ran since committed.
    pub(crate) fn sqlite_rolled_back(&self) -> bool {
        self.sqlite_rollback == SqliteRollback::Met
    }

    /// The conflict a statement of the body met and no later statement got
    /// past (see [`Transaction::postgres`]), taken.
    pub(crate) fn take_conflict(&mut self) -> Option<String> {
        self.conflict.take()
    }

    /// The first failed statement since the last that succeeded (see
    /// [`Transaction::postgres`]), taken.
    pub(crate) fn take_failed(&mut self) -> Option<String> {
        self.failed.take()
    }

    pub(crate) fn into_inner(self) -> StepTx<'c> {
        self.tx
    }

    pub(crate) fn inner(&mut self) -> &mut StepTx<'c> {
        &mut self.tx
    }

    /// `"sqlite"` or `"postgres"`: the backend the transaction runs on.
    pub fn backend(&self) -> &'static str {
        self.tx.backend()
    }

    /// The transaction's connection on PostgreSQL, for the body's statements,
    /// or `None` on SQLite. It runs at the server's default isolation level;
    /// a body that wants another sets it with its first statement (`SET
    /// TRANSACTION ISOLATION LEVEL SERIALIZABLE`). Behind a
    /// transaction-pooling proxy the transaction has run keiro's `DEALLOCATE
    /// ALL` already, after which PostgreSQL refuses that statement: set the
    /// level for the role or database there (`default_transaction_isolation`).
    ///
    /// A serialization failure (`40001`) or deadlock (`40P01`) one of its
    /// statements meets runs the step again (see [`TxConnection`]).
    ///
    /// The transaction may be the one the previous transactional step
    /// opened as it committed (keiro keeps one for up to 50 ms to save the
    /// next step a `BEGIN`): it is empty (no statement has run in it), but
    /// `now()`, the start of the transaction, may read up to 50 ms before
    /// the step began. Use `clock_timestamp()` for the time of the statement.
    #[cfg(feature = "postgres")]
    pub fn postgres(&mut self) -> Option<TxConnection<'_, sqlx::PgConnection>> {
        match &mut self.tx {
            StepTx::Postgres(tx) => Some(TxConnection {
                conn: &mut **tx,
                watched: Watched {
                    conflict: &mut self.conflict,
                    failed: &mut self.failed,
                    sqlite_rollback: &mut self.sqlite_rollback,
                },
            }),
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(_) => None,
        }
    }

    /// The transaction's connection on SQLite, for the body's statements, or
    /// `None` on PostgreSQL. The transaction began with `BEGIN IMMEDIATE`:
    /// it holds the database's write lock from its first statement, so the
    /// body's statements do not wait on other connections (and meet no
    /// BUSY; one they did meet would run the step again, see
    /// [`TxConnection`]).
    #[cfg(feature = "sqlite")]
    pub fn sqlite(&mut self) -> Option<TxConnection<'_, sqlx::SqliteConnection>> {
        match &mut self.tx {
            StepTx::Sqlite(tx) => Some(TxConnection {
                conn: &mut **tx,
                watched: Watched {
                    conflict: &mut self.conflict,
                    failed: &mut self.failed,
                    sqlite_rollback: &mut self.sqlite_rollback,
                },
            }),
            #[cfg(feature = "postgres")]
            StepTx::Postgres(_) => None,
        }
    }

    /// The SQLite transaction itself, or `None` on PostgreSQL. It began with
    /// `BEGIN IMMEDIATE`: it holds the write lock from its first statement.
    ///
    /// Statements run on it directly bypass keiro; prefer
    /// [`Transaction::sqlite`].
    #[cfg(feature = "sqlite")]
    pub fn as_sqlite(&mut self) -> Option<&mut sqlx::Transaction<'c, sqlx::Sqlite>> {
        // What the body runs on it keiro does not see.
        if self.sqlite_rollback == SqliteRollback::Met {
            self.sqlite_rollback = SqliteRollback::WentOn;
        }
        match &mut self.tx {
            StepTx::Sqlite(tx) => Some(tx),
            #[cfg(feature = "postgres")]
            StepTx::Postgres(_) => None,
        }
    }

    /// The PostgreSQL transaction itself, or `None` on SQLite (see
    /// [`Transaction::postgres`] for its isolation level and start time).
    ///
    /// Statements run on it directly (`&mut **tx`) bypass keiro: a
    /// serialization failure or deadlock they meet is only the body's `Err`,
    /// journaled as the step's outcome unless `retry_if` retries it. Prefer
    /// [`Transaction::postgres`], whose statements' conflicts run the step
    /// again.
    #[cfg(feature = "postgres")]
    pub fn as_postgres(&mut self) -> Option<&mut sqlx::Transaction<'c, sqlx::Postgres>> {
        match &mut self.tx {
            StepTx::Postgres(tx) => Some(tx),
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(_) => None,
        }
    }

    /// Whether a database error is a conflict with a concurrent transaction
    /// that a retry from the start can get past: PostgreSQL's serialization
    /// failure (SQLSTATE `40001`) or deadlock (`40P01`), SQLite's BUSY or
    /// LOCKED.
    ///
    /// keiro runs the step again, in a new transaction, when it meets one
    /// itself (beginning, writing the journal row, committing) or a statement
    /// run through [`Transaction::postgres`] or [`Transaction::sqlite`] does.
    /// One that a statement run on [`Transaction::as_postgres`] or
    /// [`Transaction::as_sqlite`] meets reaches keiro only as the body's
    /// `Err`: classify it with this function into an error variant and retry
    /// it with `#[step(transaction, max_attempts = N, retry_if = ..)]`.
    pub fn is_conflict(error: &sqlx::Error) -> bool {
        keiro_store::is_conflict(error)
    }
}

/// The connection of a [`Transaction`], for the statements of a
/// `#[step(transaction)]`'s body: [`Transaction::postgres`] or
/// [`Transaction::sqlite`] gives it, and `&mut conn` is an
/// [`sqlx::Executor`] that runs them in the step's transaction.
///
/// keiro watches what those statements return. When one fails with a
/// conflict with a concurrent transaction (PostgreSQL's serialization failure
/// `40001` or deadlock `40P01`, SQLite's BUSY or LOCKED; see
/// [`Transaction::is_conflict`]) and no later statement succeeds (as `ROLLBACK
/// TO SAVEPOINT` would, recovering from it), keiro rolls the transaction back
/// and runs the step's body again in a new one, whatever the body returned:
/// the body's `Err` is not journaled, and the run does not count against
/// `max_attempts`. The statement still returns its error to the body, which
/// may return it (on PostgreSQL the transaction is aborted anyway).
///
/// ```no_run
/// # async fn body(tx: &mut keiro::Transaction<'_>) -> Result<(), sqlx::Error> {
/// let mut db = tx.postgres().expect("PostgreSQL");
/// sqlx::query("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
///     .execute(&mut db)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TxConnection<'t, C> {
    conn: &'t mut C,
    watched: Watched<'t>,
}

/// What keiro notes of a [`TxConnection`]'s statements, in its
/// [`Transaction`].
#[derive(Debug)]
struct Watched<'t> {
    /// See `Transaction::conflict`.
    conflict: &'t mut Option<String>,
    /// See `Transaction::failed`.
    failed: &'t mut Option<String>,
    /// See `Transaction::sqlite_rollback`.
    sqlite_rollback: &'t mut SqliteRollback,
}

impl Watched<'_> {
    /// Notes what one statement returned: a conflict is noted, and the
    /// first failure since the last success; a success clears both (the body
    /// got past them, as `ROLLBACK TO SAVEPOINT` does).
    fn watch<T>(&mut self, outcome: &Result<T, sqlx::Error>) {
        *self.sqlite_rollback = match (*self.sqlite_rollback, outcome) {
            (SqliteRollback::WentOn, _) => SqliteRollback::WentOn,
            (_, Err(error)) if keiro_store::is_sqlite_rollback_error(error) => SqliteRollback::Met,
            (SqliteRollback::Met, Ok(_)) => SqliteRollback::WentOn,
            (state, _) => state,
        };
        match outcome {
            Ok(_) => {
                *self.conflict = None;
                *self.failed = None;
            }
            Err(error) => {
                if keiro_store::is_conflict(error) {
                    *self.conflict = Some(error.to_string());
                }
                self.failed.get_or_insert_with(|| error.to_string());
            }
        }
    }
}

/// `sqlx::Executor` for `&mut TxConnection<'_, $conn>`: the connection's own
/// executor, with each result [`watch`]ed.
macro_rules! watched_executor {
    ($feature:literal, $db:ty, $conn:ty) => {
        #[cfg(feature = $feature)]
        impl<'e, 't> sqlx::Executor<'e> for &'e mut TxConnection<'t, $conn> {
            type Database = $db;

            fn fetch_many<'x, 'q: 'x, E>(
                self,
                query: E,
            ) -> BoxStream<
                'x,
                Result<
                    sqlx::Either<
                        <$db as sqlx::Database>::QueryResult,
                        <$db as sqlx::Database>::Row,
                    >,
                    sqlx::Error,
                >,
            >
            where
                'e: 'x,
                E: 'q + sqlx::Execute<'q, $db>,
            {
                let watched = &mut self.watched;
                sqlx::Executor::fetch_many(&mut *self.conn, query)
                    .map(move |item| {
                        watched.watch(&item);
                        item
                    })
                    .boxed()
            }

            fn fetch_optional<'x, 'q: 'x, E>(
                self,
                query: E,
            ) -> BoxFuture<'x, Result<Option<<$db as sqlx::Database>::Row>, sqlx::Error>>
            where
                'e: 'x,
                E: 'q + sqlx::Execute<'q, $db>,
            {
                let watched = &mut self.watched;
                sqlx::Executor::fetch_optional(&mut *self.conn, query)
                    .map(move |row| {
                        watched.watch(&row);
                        row
                    })
                    .boxed()
            }

            fn prepare_with<'x, 'q: 'x>(
                self,
                sql: &'q str,
                parameters: &'x [<$db as sqlx::Database>::TypeInfo],
            ) -> BoxFuture<'x, Result<<$db as sqlx::Database>::Statement<'q>, sqlx::Error>>
            where
                'e: 'x,
            {
                sqlx::Executor::prepare_with(&mut *self.conn, sql, parameters)
            }

            fn describe<'x, 'q: 'x>(
                self,
                sql: &'q str,
            ) -> BoxFuture<'x, Result<sqlx::Describe<$db>, sqlx::Error>>
            where
                'e: 'x,
            {
                sqlx::Executor::describe(&mut *self.conn, sql)
            }
        }
    };
}

watched_executor!("postgres", sqlx::Postgres, sqlx::PgConnection);
watched_executor!("sqlite", sqlx::Sqlite, sqlx::SqliteConnection);

/// keiro's `*_tx` helpers (`send_tx`, `enqueue_tx`, `resolve_awakeable_tx`,
/// `schedule_tx`, ..) run on the transaction itself: keiro does not see
/// their statements' errors (a conflict one meets is the helper's `Err`;
/// classify it with [`crate::Error::is_conflict`]). Like
/// [`Transaction::as_sqlite`], handing the transaction to one after SQLite
/// rolled it back by itself counts as going on past that rollback: what the
/// helper wrote then committed on its own, so the step is not run again as
/// if nothing had.
impl<'t, 'c> From<&'t mut Transaction<'c>> for TimerTx<'t, 'c> {
    fn from(tx: &'t mut Transaction<'c>) -> Self {
        if tx.sqlite_rollback == SqliteRollback::Met {
            tx.sqlite_rollback = SqliteRollback::WentOn;
        }
        match &mut tx.tx {
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(tx) => TimerTx::Sqlite(tx),
            #[cfg(feature = "postgres")]
            StepTx::Postgres(tx) => TimerTx::Postgres(tx),
        }
    }
}
