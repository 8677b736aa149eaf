//! [`Transaction`]: the transaction a `#[step(transaction)]` runs in, on
//! keiro's own database.

use keiro_store::{StepTx, TimerTx};

/// A transaction on keiro's own database, handed to a
/// [`#[step(transaction)]`](crate::step) as its first argument.
///
/// keiro opens it, runs the step's body with it, writes the step's journal
/// row in it and commits: the application's writes and the step's result
/// commit together or not at all, so the step takes effect exactly once,
/// even when the process is killed between the writes and the commit.
///
/// It wraps the concrete sqlx transaction of the backend in use, so the body
/// runs ordinary sqlx queries: [`Transaction::as_postgres`] and
/// [`Transaction::as_sqlite`] give it (`None` on the other backend), and
/// [`Transaction::backend`] says which it is. A body written for one backend
/// `expect`s its transaction; one that serves both matches on them. Pass
/// `&mut **tx` (the connection inside the sqlx transaction) to sqlx queries,
/// and the `Transaction` itself to keiro's `*_tx` functions
/// ([`crate::send_tx`], [`crate::resolve_awakeable_tx`],
/// [`crate::timers::schedule_tx`]): they then commit with the step.
///
/// An `Err` from the body rolls its writes back; the `Err` is then journaled
/// like any step's (in a small transaction of its own), or the body runs
/// again in a new transaction per `max_attempts`. On replay the journaled
/// result is returned and no transaction is opened. Called outside a
/// workflow, the body runs in a transaction of the process-wide runtime
/// ([`crate::global`]), committed on success, and nothing is journaled.
///
/// Never commit, roll back or replace the sqlx transaction in the body (keiro
/// commits it once the journal row is written), and never wait on another
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
///     let tx = tx.as_postgres().expect("this service runs on PostgreSQL");
///     let balance: i64 = sqlx::query_scalar(
///         "UPDATE accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance",
///     )
///     .bind(cents)
///     .bind(account)
///     .fetch_one(&mut **tx)
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
///     let done = if let Some(tx) = tx.as_sqlite() {
///         sqlx::query(insert).bind(&order).execute(&mut **tx).await.map(drop)
///     } else if let Some(tx) = tx.as_postgres() {
///         sqlx::query(insert).bind(&order).execute(&mut **tx).await.map(drop)
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
}

impl<'c> Transaction<'c> {
    pub(crate) fn new(tx: StepTx<'c>) -> Self {
        Transaction { tx }
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

    /// The SQLite transaction, or `None` on PostgreSQL. It began with
    /// `BEGIN IMMEDIATE`: it holds the write lock from its first statement.
    #[cfg(feature = "sqlite")]
    pub fn as_sqlite(&mut self) -> Option<&mut sqlx::Transaction<'c, sqlx::Sqlite>> {
        match &mut self.tx {
            StepTx::Sqlite(tx) => Some(tx),
            #[cfg(feature = "postgres")]
            StepTx::Postgres(_) => None,
        }
    }

    /// The PostgreSQL transaction, or `None` on SQLite. It runs at the
    /// server's default isolation level; a body that wants another sets it
    /// with its first statement (`SET TRANSACTION ISOLATION LEVEL
    /// SERIALIZABLE`).
    ///
    /// It may be the transaction the previous transactional step opened as
    /// it committed (keiro keeps one for up to 50 ms to save the next step a
    /// `BEGIN`): it is empty (no statement has run in it), but `now()`, the
    /// start of the transaction, may read up to 50 ms before the step
    /// began. Use `clock_timestamp()` for the time of the statement.
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
    /// keiro retries the step at once, in a new transaction, when it meets
    /// one itself (beginning, writing the journal row, committing). One that
    /// a query in the body meets reaches keiro only as the body's `Err`:
    /// classify it with this function into an error variant and retry it
    /// with `#[step(transaction, max_attempts = N, retry_if = ..)]`.
    pub fn is_conflict(error: &sqlx::Error) -> bool {
        keiro_store::is_conflict(error)
    }
}

impl<'t, 'c> From<&'t mut Transaction<'c>> for TimerTx<'t, 'c> {
    fn from(tx: &'t mut Transaction<'c>) -> Self {
        match &mut tx.tx {
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(tx) => TimerTx::Sqlite(tx),
            #[cfg(feature = "postgres")]
            StepTx::Postgres(tx) => TimerTx::Postgres(tx),
        }
    }
}
