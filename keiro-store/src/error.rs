//! The store's error type.

use std::sync::Arc;

/// What went wrong talking to the journal database.
///
/// Cheap to clone (sources sit behind `Arc`), so one failed group commit can
/// report the same error to every step that was waiting on it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL could not be understood.
    #[error("invalid database URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The database could not be reached or opened.
    #[error("cannot connect to the keiro store at `{url}`: {source}")]
    Connect {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// The driver's error.
        #[source]
        source: Arc<sqlx::Error>,
    },
    /// Running the embedded migrations failed.
    #[error("migrating the keiro {backend} store failed: {source}")]
    Migrate {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// The migrator's error.
        #[source]
        source: Arc<sqlx::migrate::MigrateError>,
    },
    /// A statement failed.
    #[error("keiro store operation `{op}` failed: {source}")]
    Query {
        /// The store operation that failed, e.g. `append_steps`.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: Arc<sqlx::Error>,
    },
    /// A row holds a value keiro cannot interpret; it is left untouched.
    #[error("corrupt row in the keiro store: {what}")]
    Corrupt {
        /// What was found, naming the row.
        what: String,
    },
    /// The store's background writer has stopped (its runtime shut down).
    #[error("the keiro journal writer has stopped")]
    WriterStopped,
}

impl StoreError {
    pub(crate) fn query(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |source| StoreError::Query {
            op,
            source: Arc::new(source),
        }
    }

    /// Whether retrying the same operation later may succeed: the database
    /// was unreachable, busy, out of resources or shutting down, or the
    /// transaction lost a serialization race or a deadlock. A constraint
    /// violation, a statement the database refuses (syntax, undefined table,
    /// permission), corruption and anything unrecognised are not: retrying
    /// would fail the same way, so they are reported.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Connect { .. } | StoreError::WriterStopped => true,
            StoreError::Query { source, .. } => is_transient_driver_error(source),
            _ => false,
        }
    }
}

/// Whether a driver error is worth retrying (see [`StoreError::is_transient`]).
fn is_transient_driver_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => is_transient_database_error(db.as_ref()),
        _ => false,
    }
}

/// Classifies a database's own error by its code.
fn is_transient_database_error(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return is_transient_sqlstate(pg.code());
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return db.code().is_some_and(|code| is_sqlite_busy_code(&code));
    }
    let _ = db;
    false
}

/// PostgreSQL SQLSTATE classes a retry can get past: 08 connection exception,
/// 40 transaction rollback (serialization failure, deadlock), 53 insufficient
/// resources, 57 operator intervention (admin shutdown, cannot connect now).
/// Everything else (23 constraint violations, 42 syntax errors, undefined
/// objects and permissions, XX internal errors and corruption, …) is not.
#[cfg(feature = "postgres")]
fn is_transient_sqlstate(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "40" | "53" | "57"))
}

/// SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes (whose
/// low byte is the primary code): another connection holds the lock.
#[cfg(feature = "sqlite")]
fn is_sqlite_busy_code(code: &str) -> bool {
    matches!(code.parse::<i32>().map(|code| code & 0xff), Ok(5 | 6))
}

/// Whether `error` is SQLite's BUSY or LOCKED.
#[cfg(feature = "sqlite")]
pub(crate) fn is_sqlite_busy(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().is_some_and(|code| is_sqlite_busy_code(&code)))
}

/// Replaces the password of a URL with `***` so it can go into an error
/// message or a log line.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[cfg(feature = "postgres")]
    #[test]
    fn sqlstate_classes_decide() {
        use super::is_transient_sqlstate as transient;
        for code in [
            "08006", "08P01", "40001", "40P01", "53300", "57P01", "57P03",
        ] {
            assert!(transient(code), "{code}");
        }
        for code in [
            "23505", "23514", "42601", "42P01", "42501", "22P02", "XX001", "XX002",
        ] {
            assert!(!transient(code), "{code}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_busy_and_locked_with_extended_codes() {
        use super::is_sqlite_busy_code as busy;
        for code in ["5", "6", "261", "517", "262"] {
            assert!(busy(code), "{code}");
        }
        // CONSTRAINT (and its UNIQUE / CHECK forms), ERROR, CORRUPT, NOTADB.
        for code in ["19", "2067", "275", "1", "11", "26", "x"] {
            assert!(!busy(code), "{code}");
        }
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact("postgres://bob:hunter2@db:5432/keiro"),
            "postgres://bob:***@db:5432/keiro"
        );
        assert_eq!(redact("postgres://bob@db/keiro"), "postgres://bob@db/keiro");
        assert_eq!(redact("sqlite:keiro.db"), "sqlite:keiro.db");
    }
}
