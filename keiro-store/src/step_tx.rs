//! A transactional step's own transaction on the store's database: the
//! application's writes and the step's journal row commit together, or not
//! at all.
//!
//! It bypasses the group-commit writer: the transaction belongs to one step
//! and lives as long as the step's body runs. On SQLite it begins with
//! `BEGIN IMMEDIATE`, so it holds the one write lock from its first
//! statement; the writer (and other transactional steps) wait for it through
//! SQLite's busy handler, never the other way round, so the two cannot
//! deadlock. On PostgreSQL it runs at the server's default isolation level
//! (READ COMMITTED unless the application sets another in the body).

use crate::error::is_conflict;
use crate::journal::{step_args, StepTiming};
use crate::{Result, StepRow, Store, StoreError};

/// [`GUARD_RELEASE`]'s text, which [`COMMIT_SQLITE`] begins with.
#[cfg(feature = "sqlite")]
macro_rules! guard_release {
    () => {
        "RELEASE SAVEPOINT keiro_step; DELETE FROM temp.keiro_step_open"
    };
}

/// The operation named in this module's errors.
const OP: &str = "transactional_step";

/// The insert of one step row with its timing, keeping a row already there.
/// SQLite accepts PostgreSQL's `$N` placeholders, so only the table differs.
macro_rules! insert_timed_step {
    ($table:literal) => {
        concat!(
            "INSERT INTO ",
            $table,
            " (workflow_id, generation, seq, name, kind, result, created_at, attempts, \
             started_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (workflow_id, generation, seq) DO NOTHING"
        )
    };
}

#[cfg(feature = "sqlite")]
const INSERT_SQLITE: &str = insert_timed_step!("keiro_steps");
/// The guard released (failing if the body's transaction ended), a step's
/// row inserted (failing on the primary key if the step is journaled), the
/// commit, and an empty transaction for sqlx's count.
#[cfg(feature = "sqlite")]
const COMMIT_SQLITE: &str = concat!(
    guard_release!(),
    "; INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, created_at, \
     attempts, started_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9); COMMIT; BEGIN"
);
/// How much longer than a timed step's statements its PostgreSQL
/// transaction may sit idle (see [`StepTx::limit_statements`]): the server
/// counts idle time from its last answer, the step's timer from when the
/// client read it, so a tight bound would end a transaction whose attempt
/// is still within its limit.
#[cfg(feature = "postgres")]
const IDLE_GRACE_MS: i32 = 1_000;

/// The text of [`BEGIN_SQLITE`], a literal so that [`REBEGIN_SQLITE`] is
/// built from the same one.
#[cfg(feature = "sqlite")]
macro_rules! begin_sqlite {
    () => {
        "DELETE FROM temp.keiro_step_open; BEGIN IMMEDIATE; \
         INSERT INTO temp.keiro_step_open (one) VALUES (1); SAVEPOINT keiro_step"
    };
}

/// How a transactional step's transaction begins on SQLite: with the write
/// lock, the mark and the guard savepoint (see [`GUARD_RELEASE`]). A mark
/// left by an earlier transaction (one a body committed and then opened
/// again, whose cleanup its rollback undid) is cleared first, outside the
/// transaction. sqlx counts the transaction open only once the whole batch
/// has run, so a statement failing after `BEGIN IMMEDIATE` would leave the
/// connection in a transaction sqlx does not know of, holding the write
/// lock: the insert follows a delete from the same table that succeeded,
/// so only running out of memory could fail it there.
#[cfg(feature = "sqlite")]
pub(crate) const BEGIN_SQLITE: &str = begin_sqlite!();
/// [`BEGIN_SQLITE`] on a connection kept after the last transactional step's
/// commit (see [`crate::warm`]), inside the empty deferred transaction that
/// commit opened and sqlx counts open: that one rolled back, then the same
/// begin. Sent as one prepared, cached batch. A failure before `BEGIN
/// IMMEDIATE` took effect leaves the connection outside a transaction,
/// which [`rebegin_sqlite`] mends; if its future is dropped before that,
/// the pool finds the connection outside the transaction sqlx counts and
/// closes it (see `release_outside_transaction`).
#[cfg(feature = "sqlite")]
const REBEGIN_SQLITE: &str = concat!("ROLLBACK; ", begin_sqlite!());
/// The guard of a transactional step's transaction on SQLite, released:
/// the savepoint `keiro_step` it opens with, and its mark, a row of the
/// connection's own temporary table `keiro_step_open` (see
/// [`MARK_TABLE`]).
///
/// The release fails when the transaction ended under the body: a
/// `COMMIT` or `ROLLBACK` the body sent on the step's connection, or
/// SQLite's own rollback after some errors (a full disk, an I/O error, an
/// interrupt). keiro sends it before its first write after the body, so
/// the journal row is never written outside the body's transaction; the
/// commit batch begins with it. The mark then says which: it stays only
/// if the transaction committed (see [`StepTx::guard_error`]).
#[cfg(feature = "sqlite")]
const GUARD_RELEASE: &str = guard_release!();
/// The temporary table holding a SQLite transactional step's mark, made on
/// each connection as it opens: a temporary table belongs to its
/// connection, and its rows commit and roll back with the transaction.
#[cfg(feature = "sqlite")]
pub(crate) const MARK_TABLE: &str =
    "CREATE TEMP TABLE IF NOT EXISTS keiro_step_open (one INTEGER PRIMARY KEY)";
/// PostgreSQL's guard: the statement fails when the body ended the
/// transaction itself (see [`guard_factor`]). Sent before keiro's first
/// write after the body; the commit batch carries it in its row instead.
/// From here on keiro sends the transaction's statements back to back, so it
/// bounds the transaction's idle time too, as keiro's own transactions do
/// (`postgres::BEGIN`): a process that vanishes now leaves no step row
/// locked for hours. (For a timed step whose own bound is shorter, the
/// rest of its transaction gets these 5 s instead: keiro's statements, not
/// the body, come next.)
/// (A savepoint, as on SQLite, would keep the body from choosing its
/// isolation level: `SET TRANSACTION` refuses to run in a subtransaction; a
/// transaction-local setting cost a sixth of a step.)
#[cfg(feature = "postgres")]
const GUARD_CHECK: &str = concat!(
    "SELECT 1 * ",
    guard_factor!(),
    "; ",
    crate::postgres::bound_idle!()
);

/// 1 inside the step's transaction, and an error (`invalid input syntax for
/// type integer: "keiro_step_guard"`, SQLSTATE `22P02`, the marker telling
/// it from any error of the application's) in one that began with the
/// statement at hand: a body's `COMMIT` or `ROLLBACK` leaves the connection
/// outside a transaction block, so keiro's next statement runs in a
/// transaction of its own, whose start time is that statement's. The step's
/// transaction began in an earlier message (its `BEGIN`, alone or at the end
/// of the previous step's commit batch), so its start time differs. The
/// commit batch multiplies its row's generation by it, so the check costs
/// that batch no statement of its own. (A body that commits and then begins
/// a transaction of its own is not caught this way.)
#[cfg(feature = "postgres")]
macro_rules! guard_factor {
    () => {
        "CAST(CASE WHEN transaction_timestamp() <> statement_timestamp() THEN '1' \
         ELSE 'keiro_step_guard' END AS int)"
    };
}
#[cfg(feature = "postgres")]
use guard_factor;
#[cfg(feature = "postgres")]
const INSERT_POSTGRES: &str = insert_timed_step!("keiro.steps");
/// Whether a failed statement met the primary key of keiro's own steps
/// table on PostgreSQL (the step was journaled first), and not a constraint
/// of the application's that happens to share its name (`steps_pkey` is
/// PostgreSQL's default for any table `steps`).
#[cfg(feature = "postgres")]
fn is_journal_key(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|pg| {
            pg.code() == "23505"
                && pg.schema() == Some("keiro")
                && pg.table() == Some("steps")
                && pg.constraint() == Some("steps_pkey")
        })
}

/// Whether `error` is the guard failing because the body ended the
/// transaction: SQLite has no such savepoint; PostgreSQL's guard factor
/// read its marker.
fn is_guard_lost(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg.code() == "22P02" && pg.message().contains("\"keiro_step_guard\"");
    }
    db.message().contains("no such savepoint: keiro_step")
}

/// Whether `error` is PostgreSQL's refusal of a statement in a transaction
/// that an earlier failed statement aborted (SQLSTATE `25P02`): met by
/// keiro's first statement after a body that swallowed that failure.
fn is_aborted(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    db.code().as_deref() == Some("25P02")
}

/// A transaction a transactional step runs in, on the store's database.
///
/// Dropping it without [`StepTx::commit`] rolls it back.
#[derive(Debug)]
pub enum StepTx<'c> {
    /// A SQLite transaction, begun with `BEGIN IMMEDIATE`.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::Transaction<'c, sqlx::Sqlite>),
    /// A PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'c, sqlx::Postgres>),
}

impl Store {
    /// Begins a transaction for a transactional step (taking SQLite's write
    /// lock at once), on the connection the last transactional step kept
    /// if there is one (see `journal_and_commit`): on PostgreSQL it is the
    /// open, empty transaction that step committed into; on SQLite that
    /// empty deferred transaction is rolled back and the step's begun.
    pub async fn begin_step_tx(&self) -> Result<StepTx<'static>> {
        Ok(match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => StepTx::Sqlite(match s.take_warm() {
                Some(kept) => rebegin_sqlite(kept).await?,
                None => s.begin_ungated(BEGIN_SQLITE, OP).await?,
            }),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => StepTx::Postgres(s.begin_step(OP).await?),
        })
    }
}

/// Begins a transactional step's transaction on `kept`, a connection kept
/// inside an empty deferred transaction (see [`REBEGIN_SQLITE`]). On an
/// error a transaction is opened again if none is (the error may have come
/// after the batch's `ROLLBACK`), so the one sqlx counts open is there for
/// the rollback that dropping `kept` sends.
#[cfg(feature = "sqlite")]
async fn rebegin_sqlite(
    mut kept: sqlx::Transaction<'static, sqlx::Sqlite>,
) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
    match crate::prepared::query(REBEGIN_SQLITE)
        .execute(&mut *kept)
        .await
    {
        Ok(_) => Ok(kept),
        Err(error) => {
            // Fails harmlessly when the connection is still in a transaction.
            let _ = sqlx::Executor::execute(&mut *kept, "BEGIN").await;
            Err(StoreError::query(OP)(error))
        }
    }
}

impl StepTx<'_> {
    /// Checks that the body left keiro's transaction open (releasing its
    /// guard savepoint on SQLite): [`StoreError::TransactionEnded`] when the body sent
    /// `COMMIT` or `ROLLBACK` itself (nothing is written then). Call it once,
    /// after the body and before [`StepTx::journal`], [`StepTx::commit`] or
    /// the rollback of a failed attempt; [`StepTx::journal_and_commit`]
    /// checks by itself.
    pub async fn check_open(&mut self) -> Result<()> {
        let released = match self {
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(tx) => sqlx::Executor::execute(&mut **tx, GUARD_RELEASE)
                .await
                .map(drop),
            #[cfg(feature = "postgres")]
            StepTx::Postgres(tx) => sqlx::Executor::execute(&mut **tx, GUARD_CHECK)
                .await
                .map(drop),
        };
        match released {
            Ok(()) => Ok(()),
            Err(error) => Err(self.guard_error(error).await),
        }
    }

    /// Bounds each statement of the body to `ms` milliseconds on
    /// PostgreSQL (`SET LOCAL statement_timeout`, ending with the
    /// transaction), for a step whose attempts have a time limit: an attempt
    /// out of time is dropped by the runtime, and the rollback after it then
    /// waits for the statement it left running, blocked on another
    /// session's lock for all anyone knows, at most this long. The
    /// transaction may sit idle (waiting for the body's next statement) not
    /// much longer either (`idle_in_transaction_session_timeout`, a second
    /// more): an attempt cannot outlast its limit, so an idle transaction
    /// that does belongs to a process that lost the server, and the server
    /// ends it, releasing the rows it holds locked, instead of keeping it
    /// for hours. Nothing on
    /// SQLite, where the transaction holds the write lock from its start, so
    /// the body's statements wait on no lock.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub async fn limit_statements(&mut self, ms: u64) -> Result<()> {
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let StepTx::Postgres(tx) = self {
            // PostgreSQL takes at most `i32::MAX` ms (24.8 days); a longer
            // limit bounds nothing worth a statement.
            let Ok(ms) = i32::try_from(ms.max(1)) else {
                return Ok(());
            };
            let idle = ms.saturating_add(IDLE_GRACE_MS);
            let set = format!(
                "SET LOCAL statement_timeout = {ms}; \
                 SET LOCAL idle_in_transaction_session_timeout = {idle}"
            );
            // Without arguments, one simple query: nothing prepared (behind
            // a transaction-pooling proxy too), one round trip.
            sqlx::Executor::execute(&mut **tx, set.as_str())
                .await
                .map_err(StoreError::query(OP))?;
        }
        Ok(())
    }

    /// The error for a failed statement that began with the guard:
    /// [`StoreError::TransactionEnded`] when the guard was gone (then, on
    /// SQLite, a transaction is opened again for the one sqlx counts as
    /// open, so its rollback finds one), or
    /// [`StoreError::TransactionRolledBack`] when SQLite's mark says the
    /// transaction that ended rolled back,
    /// [`StoreError::TransactionAborted`] when an earlier statement of the
    /// body had aborted it (PostgreSQL), else the query error.
    async fn guard_error(&mut self, error: sqlx::Error) -> StoreError {
        if is_aborted(&error) {
            return StoreError::TransactionAborted {
                reason: error.to_string(),
            };
        }
        if !is_guard_lost(&error) {
            return StoreError::query(OP)(error);
        }
        #[cfg(feature = "sqlite")]
        #[allow(irrefutable_let_patterns)]
        if let StepTx::Sqlite(tx) = self {
            // The transaction's mark stays only if it committed: the body's
            // writes did too. A mark that cannot be read counts as one. (The
            // next step's BEGIN batch clears it.)
            let marks: std::result::Result<i64, _> =
                sqlx::query_scalar("SELECT count(*) FROM temp.keiro_step_open")
                    .fetch_one(&mut **tx)
                    .await;
            let committed = marks.map_or(true, |n| n > 0);
            // Fails harmlessly if the body began a transaction of its own.
            let _ = sqlx::Executor::execute(&mut **tx, "BEGIN").await;
            if !committed {
                return StoreError::TransactionRolledBack {
                    reason: error.to_string(),
                };
            }
        }
        StoreError::TransactionEnded {
            reason: error.to_string(),
        }
    }

    /// Writes `rows` (with their `timings`, as long as `rows`) into this
    /// transaction unless their step ids are journaled. Returns, per row,
    /// whether it was written: `false` means another executor journaled that
    /// step first (its transaction committed), and the caller rolls this one
    /// back and takes the recorded result. `now` is the store's clock
    /// ([`Store::now_us`]), the rows' creation time. Call
    /// [`StepTx::check_open`] first.
    pub async fn journal(&mut self, rows: &[(StepRow, StepTiming)], now: i64) -> Result<Vec<bool>> {
        let mut written = Vec::with_capacity(rows.len());
        for (row, timing) in rows {
            let affected = match self {
                #[cfg(feature = "sqlite")]
                StepTx::Sqlite(tx) => {
                    bind_all!(crate::prepared::query(INSERT_SQLITE), &step_args(row, now))
                        .bind(timing.attempts_column())
                        .bind(timing.started_at)
                        .execute(&mut **tx)
                        .await
                        .map(|done| done.rows_affected())
                }
                #[cfg(feature = "postgres")]
                StepTx::Postgres(tx) => bind_all!(
                    crate::prepared::query(INSERT_POSTGRES),
                    &step_args(row, now)
                )
                .bind(timing.attempts_column())
                .bind(timing.started_at)
                .execute(&mut **tx)
                .await
                .map(|done| done.rows_affected()),
            };
            let affected = affected.map_err(StoreError::query(OP))?;
            written.push(affected == 1);
        }
        Ok(written)
    }

    /// Commits the application's writes and the journal rows together.
    pub async fn commit(self) -> Result<()> {
        dispatch!(StepTx, self, |tx| tx.commit().await).map_err(StoreError::query(OP))
    }

    /// Rolls the transaction back, application writes included.
    pub async fn rollback(self) -> Result<()> {
        dispatch!(StepTx, self, |tx| tx.rollback().await).map_err(StoreError::query(OP))
    }

    /// `"sqlite"` or `"postgres"`, like [`Store::backend`].
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            StepTx::Postgres(_) => "postgres",
        }
    }
}

impl StepTx<'static> {
    /// Writes one step's row (with its `timing`) into this transaction and
    /// commits, unless the step is journaled already: then it rolls back,
    /// the application's writes with it, and returns `false` (another
    /// executor journaled the step first; the caller takes the recorded
    /// result). `now` is the store's clock, the row's creation time; `store`
    /// is the store the transaction was begun on.
    ///
    /// The guard, the row and the `COMMIT` travel together, with a `BEGIN`
    /// after them: one statement batch `<guard>; INSERT …; COMMIT; BEGIN`
    /// (the guard: SQLite's savepoint released, PostgreSQL's setting
    /// checked; see [`StepTx::check_open`]). The guard fails when the body
    /// ended the transaction itself ([`StoreError::TransactionEnded`]), and
    /// the plain `INSERT` fails on the primary key when the step is
    /// journaled; either skips the rest of the batch and leaves the
    /// transaction to roll back. The `BEGIN` opens an empty transaction (no
    /// lock, no snapshot) for the one sqlx still counts as open.
    /// - PostgreSQL: one simple query with the row's values as constants (see
    ///   `Arg::push_pg_literal`), one round trip. The empty transaction is
    ///   kept for the next transactional step (see `warm`), which then
    ///   needs no `BEGIN` of its own; else dropping it queues a `ROLLBACK`
    ///   that goes with the check the pool makes of a returning connection.
    ///   A value holding NUL (keiro refuses such ids, and JSON escapes it)
    ///   cannot be a constant: that row takes [`StepTx::journal`], then
    ///   [`StepTx::commit`].
    /// - SQLite: one prepared batch with the row's values bound, one hop to
    ///   the connection's thread instead of two. The empty deferred
    ///   transaction (no lock, no snapshot) is kept for the next
    ///   transactional step too (see `warm`).
    pub async fn journal_and_commit(
        mut self,
        store: &Store,
        row: StepRow,
        timing: StepTiming,
        now: i64,
    ) -> Result<bool> {
        match &mut self {
            #[cfg(feature = "sqlite")]
            StepTx::Sqlite(tx) => {
                let done = bind_all!(crate::prepared::query(COMMIT_SQLITE), &step_args(&row, now))
                    .bind(timing.attempts_column())
                    .bind(timing.started_at)
                    .execute(&mut **tx)
                    .await;
                match done {
                    Ok(_) => {
                        #[allow(irrefutable_let_patterns)]
                        if let (StepTx::Sqlite(tx), Store::Sqlite(store)) = (self, store) {
                            store.keep_warm(tx);
                        }
                        Ok(true)
                    }
                    Err(sqlx::Error::Database(db))
                        if db.kind() == sqlx::error::ErrorKind::UniqueViolation
                            && db.message().contains("keiro_steps.") =>
                    {
                        self.rollback().await?;
                        Ok(false)
                    }
                    Err(error) => Err(self.guard_error(error).await),
                }
            }
            #[cfg(feature = "postgres")]
            StepTx::Postgres(tx) => {
                let Some(sql) = insert_and_commit_sql(&row, timing, now) else {
                    self.check_open().await?;
                    let written = self.journal(&[(row, timing)], now).await?;
                    if written[0] {
                        self.commit().await?;
                    } else {
                        self.rollback().await?;
                    }
                    return Ok(written[0]);
                };
                // A query string without arguments goes as a simple query
                // (several statements, nothing prepared or cached).
                match sqlx::Executor::execute(&mut **tx, sql.as_str()).await {
                    Ok(_) => {
                        #[allow(irrefutable_let_patterns)]
                        if let (StepTx::Postgres(tx), Store::Postgres(store)) = (self, store) {
                            store.keep_warm(tx);
                        }
                        Ok(true)
                    }
                    // Only the journal's own key says the step was
                    // journaled first: an application's deferred unique
                    // constraint failing at the COMMIT is an error.
                    Err(sqlx::Error::Database(db)) if is_journal_key(&*db) => {
                        self.rollback().await?;
                        Ok(false)
                    }
                    Err(error) => Err(self.guard_error(error).await),
                }
            }
        }
    }
}

impl StoreError {
    /// Whether the transaction lost a race with another one and retrying it
    /// from the start may succeed: a serialization failure or deadlock on
    /// PostgreSQL (SQLSTATE `40001`, `40P01`), SQLite's BUSY or LOCKED, met
    /// by a store operation or by a statement of the step's body
    /// ([`StoreError::Conflict`]), or a debounced call's stale snapshot
    /// ([`StoreError::BurstConflict`]).
    pub fn is_conflict(&self) -> bool {
        match self {
            StoreError::Query { source, .. } => is_conflict(source),
            StoreError::Conflict { .. } | StoreError::BurstConflict { .. } => true,
            _ => false,
        }
    }
}

/// The simple query that inserts step `row` (failing on the primary key if
/// the step is journaled, and on the guard, see [`guard_factor`]),
/// commits, and opens an empty transaction (kept for the next step); `None`
/// when a value cannot be a constant (text holding NUL).
#[cfg(feature = "postgres")]
fn insert_and_commit_sql(row: &StepRow, timing: StepTiming, now: i64) -> Option<String> {
    let mut sql = String::with_capacity(320 + row.result.len());
    sql.push_str(
        "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, created_at, \
         attempts, started_at) VALUES (",
    );
    let step = step_args(row, now);
    let timed = [
        crate::query::Arg::from(timing.attempts_column()),
        crate::query::Arg::from(timing.started_at),
    ];
    for (i, arg) in step.iter().chain(&timed).enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        if !arg.push_pg_literal(&mut sql) {
            return None;
        }
        if i == 1 {
            // The generation, times the guard: failing the insert when the
            // body ended the transaction.
            sql.push_str(concat!(" * ", guard_factor!()));
        }
    }
    sql.push_str("); COMMIT; BEGIN");
    Some(sql)
}
