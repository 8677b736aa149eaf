//! Running one shared statement on either backend: its parameters as a list
//! of [`Arg`]s, its rows decoded with [`FromRow`], its failure named after
//! the operation.

use crate::rows::FromRow;
use crate::sql::Statements;
use crate::{Registered, Result, Store, StoreError};

/// Picks one statement out of a backend's [`Statements`].
pub(crate) type Statement = fn(&Statements) -> &String;

/// The name of a store operation, as its errors report it.
pub(crate) type Op = &'static str;

/// A statement parameter, so one body binds a list of them on both backends
/// (see [`bind_all!`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// Text.
    Text(&'a str),
    /// Text or NULL.
    MaybeText(Option<&'a str>),
    /// An integer.
    Int(i64),
    /// An integer or NULL.
    MaybeInt(Option<i64>),
}

impl Arg<'_> {
    /// Appends this value to `sql` as a PostgreSQL constant, for a statement
    /// sent without parameters (the simple-query protocol: several
    /// statements in one round trip). Text becomes an escape-string constant
    /// (`E'…'`, each backslash and quote doubled), which reads the same
    /// whatever the server's `standard_conforming_strings`. Returns `false`,
    /// with `sql` unchanged, for text holding a NUL character, which such a
    /// statement cannot carry.
    #[cfg(feature = "postgres")]
    pub(crate) fn push_pg_literal(&self, sql: &mut String) -> bool {
        use std::fmt::Write as _;
        let text = match *self {
            Arg::Int(n) | Arg::MaybeInt(Some(n)) => {
                let _ = write!(sql, "{n}");
                return true;
            }
            Arg::MaybeInt(None) | Arg::MaybeText(None) => {
                sql.push_str("NULL");
                return true;
            }
            Arg::Text(text) | Arg::MaybeText(Some(text)) => text,
        };
        if text.contains('\0') {
            return false;
        }
        sql.push_str("E'");
        for c in text.chars() {
            match c {
                '\\' => sql.push_str("\\\\"),
                '\'' => sql.push_str("''"),
                c => sql.push(c),
            }
        }
        sql.push('\'');
        true
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Arg::MaybeText(value)
    }
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(value)
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(value: Option<i64>) -> Self {
        Arg::MaybeInt(value)
    }
}

/// An array of [`Arg`]s, one per value (`&str`, `&String`, `i64`, or an
/// `Option` of text or integer), in placeholder order.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        [$($crate::query::Arg::from($value)),*]
    };
}

/// Binds every [`Arg`] of `$args` to `$query` (a `sqlx::query` or
/// `sqlx::query_scalar`), in order.
macro_rules! bind_all {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match *arg {
                $crate::query::Arg::Text(value) => query.bind(value),
                $crate::query::Arg::MaybeText(value) => query.bind(value),
                $crate::query::Arg::Int(value) => query.bind(value),
                $crate::query::Arg::MaybeInt(value) => query.bind(value),
            };
        }
        query
    }};
}

impl Store {
    /// Reads at most one row.
    pub(crate) async fn fetch_optional<T: FromRow>(
        &self,
        op: Op,
        pick: Statement,
        args: &[Arg<'_>],
    ) -> Result<Option<T>> {
        dispatch!(Store, self, |s, sql| {
            let write = writes(pick(sql));
            let _turn = match write {
                true => Some(s.write_turn().await),
                false => None,
            };
            let query = bind_all!(crate::prepared::query(pick(sql)), args);
            // A write runs to its end: SQLite commits a lone statement there,
            // and reading only its first row resets it early, where sqlx
            // drops what the reset (the commit) returned.
            let row = match write {
                true => query
                    .fetch_all(s.exec())
                    .await
                    .map(|rows| rows.into_iter().next()),
                false => query.fetch_optional(s.exec()).await,
            }
            .map_err(StoreError::query(op))?;
            row.as_ref().map(|row| T::from_row(row)).transpose()
        })
    }

    /// Reads every row; with `registered`, the backend binds those workflows
    /// after `args` (see `sqlite/resume.rs`, `postgres/resume.rs`).
    pub(crate) async fn fetch_all<T: FromRow>(
        &self,
        op: Op,
        pick: Statement,
        args: &[Arg<'_>],
        registered: Option<&[Registered<'_>]>,
    ) -> Result<Vec<T>> {
        self.fetch_each(op, pick, args, registered)
            .await?
            .into_iter()
            .collect()
    }

    /// [`Store::fetch_all`] reading each row on its own: a row that does
    /// not decode is its own `Err`, and the others still read.
    pub(crate) async fn fetch_each<T: FromRow>(
        &self,
        op: Op,
        pick: Statement,
        args: &[Arg<'_>],
        registered: Option<&[Registered<'_>]>,
    ) -> Result<Vec<Result<T>>> {
        dispatch!(Store, self, |s, sql| {
            let _turn = match writes(pick(sql)) {
                true => Some(s.write_turn().await),
                false => None,
            };
            let mut query = bind_all!(crate::prepared::query(pick(sql)), args);
            if let Some(workflows) = registered {
                query = s.bind_registered(query, workflows);
            }
            let rows = query
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query(op))?;
            Ok(rows.iter().map(|row| T::from_row(row)).collect())
        })
    }

    /// Runs a statement; returns how many rows it changed.
    pub(crate) async fn execute(&self, op: Op, pick: Statement, args: &[Arg<'_>]) -> Result<u64> {
        dispatch!(Store, self, |s, sql| {
            let _turn = s.write_turn().await;
            bind_all!(crate::prepared::query(pick(sql)), args)
                .execute(s.exec())
                .await
                .map(|done| done.rows_affected())
        })
        .map_err(StoreError::query(op))
    }

    /// Runs a `SELECT count(*)`.
    pub(crate) async fn count(&self, op: Op, pick: Statement, args: &[Arg<'_>]) -> Result<u64> {
        let n: i64 = dispatch!(Store, self, |s, sql| bind_all!(
            crate::prepared::query_scalar(pick(sql)),
            args
        )
        .fetch_one(s.exec())
        .await)
        .map_err(StoreError::query(op))?;
        Ok(n.max(0) as u64)
    }
}

/// Whether `statement` writes (an `INSERT`, `UPDATE` or `DELETE`, alone or
/// under a `WITH`): a lone write takes the SQLite store's write turn (see
/// `sqlite/gate.rs`). Reads take none; a read taken for a write only waits
/// its turn needlessly.
fn writes(statement: &str) -> bool {
    statement
        .split(|c: char| !c.is_ascii_alphabetic())
        .any(|word| matches!(word, "INSERT" | "UPDATE" | "DELETE"))
}

/// A connection a store's `acquire` handed out for statements that each
/// commit alone. Behind a transaction-pooling proxy it is a transaction
/// (see `postgres/exec.rs`), which only [`Session::done`] commits: call it
/// once the statements succeeded.
pub(crate) trait Session {
    /// Ends the session, committing what it wrote if that is still to do.
    async fn done(self, op: &'static str) -> crate::Result<()>;
}

#[cfg(feature = "sqlite")]
impl Session for sqlx::pool::PoolConnection<sqlx::Sqlite> {
    async fn done(self, _op: &'static str) -> crate::Result<()> {
        Ok(())
    }
}

/// Rolls `tx` back and returns `value`: an operation that refuses after
/// taking row locks releases them before it returns, instead of whenever the
/// pool gets round to the rollback a dropped transaction queues (until then
/// a worker's `SKIP LOCKED` claim would pass the row over).
pub(crate) async fn rolled_back<Tx: RollBack, T>(
    tx: Tx,
    op: &'static str,
    value: T,
) -> crate::Result<T> {
    tx.roll_back().await.map_err(crate::StoreError::query(op))?;
    Ok(value)
}

/// A transaction [`rolled_back`] can end: sqlx's, or SQLite's gated one.
pub(crate) trait RollBack {
    /// Rolls the transaction back.
    fn roll_back(self) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send;
}

impl<DB: sqlx::Database> RollBack for sqlx::Transaction<'_, DB> {
    fn roll_back(self) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send {
        self.rollback()
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::Arg;

    fn literal(arg: Arg<'_>) -> Option<String> {
        let mut sql = String::from("x");
        arg.push_pg_literal(&mut sql).then_some(sql)
    }

    #[test]
    fn postgres_constants_are_escape_strings() {
        assert_eq!(literal(Arg::Text(r"it's \'")).unwrap(), r"xE'it''s \\'''");
        assert_eq!(literal(Arg::Text("é;")).unwrap(), "xE'é;'");
        assert_eq!(literal(Arg::Int(-7)).unwrap(), "x-7");
        assert_eq!(literal(Arg::MaybeInt(Some(3))).unwrap(), "x3");
        assert_eq!(literal(Arg::MaybeInt(None)).unwrap(), "xNULL");
        assert_eq!(literal(Arg::MaybeText(None)).unwrap(), "xNULL");
    }

    #[test]
    fn text_holding_nul_is_refused_and_leaves_the_statement_alone() {
        assert_eq!(literal(Arg::Text("a\0b")), None);
        let mut sql = String::from("x");
        assert!(!Arg::MaybeText(Some("\0")).push_pg_literal(&mut sql));
        assert_eq!(sql, "x");
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod write_tests {
    use super::writes;

    #[test]
    fn statements_that_write_are_told_from_reads() {
        let sql = &*crate::sqlite::SQL;
        for statement in [
            &sql.claim_due,
            &sql.renew_lease,
            &sql.release,
            &sql.finish_alone,
        ] {
            assert!(writes(statement), "{statement}");
        }
        for statement in [&sql.get_instance, &sql.load_journal] {
            assert!(!writes(statement), "{statement}");
        }
        assert!(writes(
            "WITH f(id) AS (VALUES (?)) UPDATE t SET a = 1 FROM f"
        ));
        assert!(!writes("SELECT updated_at, inserted FROM t"));
    }
}
