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

    /// Whether retrying the same operation later may succeed (the database was
    /// unreachable, busy or timed out), as opposed to a fault in the data or the
    /// configuration.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Connect { .. } | StoreError::WriterStopped => true,
            StoreError::Query { source, .. } => matches!(
                source.as_ref(),
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::Database(_)
            ),
            _ => false,
        }
    }
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
