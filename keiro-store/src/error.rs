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
    /// The database opened, but only for reading: keiro cannot journal there.
    #[error(
        "the keiro store at `{url}` is read-only ({reason}): keiro writes its journal \
         there; open a file this process may write (and no `mode=ro` in the URL)"
    )]
    ReadOnly {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What refused the write.
        reason: String,
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
    /// The database's schema is older than this build's (or absent), and
    /// the store was opened without migrating
    /// ([`StoreOptions::migrate`](crate::StoreOptions::migrate) `false`).
    #[error(
        "the keiro store at `{url}` is {}, but this keiro needs schema version {expected}: \
         run `keiro migrate` (or start any keiro worker, which migrates on connect)",
        match .version { Some(v) => format!("at schema version {v}"), None => "not migrated (no keiro schema)".to_owned() }
    )]
    NotMigrated {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// The highest migration applied there, if any.
        version: Option<i64>,
        /// The highest migration this build embeds.
        expected: i64,
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
    /// A statement of a transactional step's body lost a race with a
    /// concurrent transaction: a serialization failure or deadlock on
    /// PostgreSQL (SQLSTATE `40001`, `40P01`), BUSY or LOCKED on SQLite. Its
    /// transaction rolled back; running the step again from the start may
    /// succeed.
    #[error("transactional step `{step}` lost a race with a concurrent transaction: {reason}")]
    Conflict {
        /// The step whose body met it.
        step: &'static str,
        /// The database's error, as the body's statement got it.
        reason: String,
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
    /// An id, name or key was refused before reaching the database: empty,
    /// holding a NUL byte, or longer than [`crate::MAX_ID_BYTES`].
    #[error("invalid {what} `{value_preview}`: {reason}")]
    InvalidId {
        /// Which value, e.g. `workflow id` or `timer key`.
        what: &'static str,
        /// The value's start, escaped, with its length when cut.
        value_preview: String,
        /// What is wrong with it and what to do.
        reason: String,
    },
    /// An instance was enqueued with a dedup key that an unfinished instance
    /// of the same queue holds.
    #[error(
        "queue `{queue}` already holds unfinished instance `{existing_id}` with dedup key \
         `{key}`; wait for it to finish or use another key"
    )]
    Duplicate {
        /// The queue.
        queue: String,
        /// The dedup key.
        key: String,
        /// The unfinished instance holding it.
        existing_id: String,
    },
    /// A debounced call made in the caller's transaction could not see the
    /// current state of its burst: another transaction opened or claimed
    /// the burst after this transaction's snapshot was taken (PostgreSQL
    /// `REPEATABLE READ` or `SERIALIZABLE`; on SQLite a deferred transaction
    /// that had read before the other committed). Joining a burst it cannot
    /// see, or opening a second one, would fold the calls wrongly, so the
    /// call wrote nothing; the database has aborted the transaction (or will
    /// refuse its writes), and running it again from the start may succeed
    /// (it is [transient](StoreError::is_transient) and a
    /// [conflict](StoreError::is_conflict)).
    #[error(
        "the debounced call of workflow `{name}` with key `{key}` cannot be folded into its \
         burst from this transaction's snapshot: a transaction that committed after the \
         snapshot was taken conflicts with it (one that opened or claimed the burst, or, under \
         SERIALIZABLE, another of this transaction's reads) ({source}); roll the transaction \
         back and run it again (a READ COMMITTED transaction on PostgreSQL, or one begun with \
         BEGIN IMMEDIATE on SQLite, avoids this)"
    )]
    BurstConflict {
        /// The debounced workflow.
        name: String,
        /// The debounce key.
        key: String,
        /// The database's error.
        #[source]
        source: Arc<sqlx::Error>,
    },
    /// A debounced call's absolute deadline is not after the time its
    /// burst's instance would start: the instance would time out unrun.
    /// Nothing was written.
    #[error(
        "debounced workflow `{name}` (key `{key}`) was given a deadline not after its burst's \
         instance would start ({} ms before it): it would time out before it ran, so the call \
         was not recorded; give a deadline after the burst's start, or a `.timeout(..)`, which \
         moves with the start",
        (start_us - deadline_us) / 1000
    )]
    DeadlineBeforeStart {
        /// The debounced workflow.
        name: String,
        /// The debounce key.
        key: String,
        /// The call's deadline (µs since the Unix epoch).
        deadline_us: i64,
        /// When the burst's instance would start (µs since the Unix epoch).
        start_us: i64,
    },
    /// A transactional step's body ended keiro's transaction itself (it sent
    /// `COMMIT` or `ROLLBACK` on the step's connection): keiro found the
    /// savepoint it opens with the transaction gone when it came to write the
    /// journal row, and wrote nothing.
    #[error(
        "the body ended keiro's transaction itself (a COMMIT or ROLLBACK on the step's \
         connection): its writes before that statement committed or rolled back apart from \
         the step's journal row, and nothing was journaled ({reason}); let keiro end the \
         transaction: return Ok to commit the writes, Err to roll them back"
    )]
    TransactionEnded {
        /// The database's error for the guard savepoint's release.
        reason: String,
    },
    /// A transactional step's transaction was rolled back under its body on
    /// SQLite: by a `ROLLBACK` the body sent, or by SQLite itself after an
    /// error such as a full disk, an I/O error or an interrupt. Nothing
    /// written in it committed and nothing was journaled; statements the
    /// body ran after it committed each on its own. keiro's runtime takes it
    /// for a failed attempt (retried per `max_attempts`) only when the body
    /// returned `Err` and its last statement on the watched connection
    /// failed with an error after which SQLite rolls back by itself (see
    /// [`is_sqlite_rollback_error`]); otherwise the run fails as for
    /// [`StoreError::TransactionEnded`].
    #[error(
        "the step's transaction was rolled back under its body (a ROLLBACK on the step's \
         connection, or SQLite's own after an error such as a full disk, an I/O error or an \
         interrupt), so nothing written in it committed, and nothing was journaled \
         ({reason}); statements the body ran after that committed each on its own, so it \
         does not run again: let keiro end the transaction, and return the error of a \
         statement that failed"
    )]
    TransactionRolledBack {
        /// The database's error for the guard savepoint's release.
        reason: String,
    },
    /// A transactional step's body returned `Ok` although PostgreSQL had
    /// aborted its transaction at a statement that failed (SQLSTATE
    /// `25P02` at keiro's first statement after the body): none of the
    /// body's writes can commit, and nothing was journaled.
    #[error(
        "the body returned Ok after one of its statements failed: PostgreSQL aborted the \
         transaction at that statement, so none of the body's writes can commit, and nothing \
         was journaled ({reason}); return that statement's error from the body (an Err rolls \
         the writes back and follows max_attempts), or run a statement that may fail inside a \
         SAVEPOINT and roll back to it"
    )]
    TransactionAborted {
        /// The failed statement's error when keiro saw it (a statement run
        /// through `Transaction::postgres`), and the database's error at
        /// keiro's statement.
        reason: String,
    },
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
            StoreError::WriterStopped
            | StoreError::Conflict { .. }
            | StoreError::BurstConflict { .. } => true,
            // A server that refuses or is starting up may come back; a file
            // that cannot be opened, bad credentials or a missing database
            // will not.
            StoreError::Connect { source, .. } | StoreError::Query { source, .. } => {
                is_transient_driver_error(source)
            }
            _ => false,
        }
    }
}

impl StoreError {
    /// Whether the database answered the operation: `false` when the
    /// connection broke (or SQLite's connection thread died) before an
    /// answer came, so a write may have committed all the same.
    pub fn is_answered(&self) -> bool {
        match self {
            StoreError::Query { source, .. } => {
                !matches!(**source, sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed)
            }
            _ => true,
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
/// resources, 57 operator intervention (admin shutdown, cannot connect now);
/// and 25006, a write on a server that takes none (a primary demoted in a
/// switchover answers so until its sessions end; nothing, not even a
/// failure, can be recorded there, and a retry reaches the new primary);
/// 25P03 and 25P04, a session the server ended because its transaction sat
/// idle or ran past `idle_in_transaction_session_timeout` /
/// `transaction_timeout` (keiro bounds its own transactions so: the client
/// stalled, and the transaction rolled back before anything of it
/// committed). Everything else (23 constraint violations, 42 syntax errors, undefined
/// objects and permissions, XX internal errors and corruption, …) is not.
#[cfg(feature = "postgres")]
fn is_transient_sqlstate(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "40" | "53" | "57"))
        || matches!(code, "25006" | "25P03" | "25P04")
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

/// Whether `error` says a transaction lost a race and retrying it from the
/// start may succeed: PostgreSQL's serialization failure (SQLSTATE `40001`)
/// or deadlock (`40P01`), SQLite's BUSY or LOCKED.
pub fn is_conflict(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return matches!(pg.code(), "40001" | "40P01");
    }
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return db.code().is_some_and(|code| is_sqlite_busy_code(&code));
    }
    false
}

/// Whether `error` is one of the SQLite errors after which SQLite may roll
/// the whole transaction back by itself: BUSY, NOMEM, INTERRUPT, IOERR or
/// FULL (extended codes included).
pub fn is_sqlite_rollback_error(error: &sqlx::Error) -> bool {
    #[cfg(feature = "sqlite")]
    if let sqlx::Error::Database(db) = error {
        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
            let code = db.code().and_then(|code| code.parse::<i32>().ok());
            return code.is_some_and(|code| matches!(code & 0xff, 5 | 7 | 9 | 10 | 13));
        }
    }
    let _ = error;
    false
}

/// Replaces every credential in a URL with `***` so it can go into an error
/// message, a log line or a `Debug` output: the password of the userinfo
/// (`user:pass@host`, the userinfo ending at the last `@` before the path,
/// so a password may hold an `@`), and the value of each query parameter
/// naming a password (`password`, `pass`, `passwd`, `pwd`, `sslpassword`,
/// `pgpassword`, or any other name ending in `password`; matched
/// case-insensitively and after percent-decoding, in any position). The
/// scheme, user, host, port, path and other parameters are kept.
pub fn redact(url: &str) -> String {
    let (head, query) = match url.find("://") {
        Some(scheme_end) => {
            let authority_start = scheme_end + 3;
            let rest = &url[authority_start..];
            let authority_end = authority_start + rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &url[authority_start..authority_end];
            let mut head = String::with_capacity(url.len());
            head.push_str(&url[..authority_start]);
            match authority.rfind('@') {
                Some(at) => {
                    let userinfo = &authority[..at];
                    match userinfo.find(':') {
                        Some(colon) => {
                            head.push_str(&userinfo[..colon]);
                            head.push_str(":***");
                        }
                        None => head.push_str(userinfo),
                    }
                    head.push_str(&authority[at..]);
                }
                None => head.push_str(authority),
            }
            let after = &url[authority_end..];
            match after.find('?') {
                Some(q) => {
                    head.push_str(&after[..q]);
                    (head, Some(&after[q + 1..]))
                }
                None => {
                    head.push_str(after);
                    (head, None)
                }
            }
        }
        None => match url.find('?') {
            Some(q) => (url[..q].to_owned(), Some(&url[q + 1..])),
            None => (url.to_owned(), None),
        },
    };
    let Some(query) = query else {
        return head;
    };
    let (query, fragment) = match query.find('#') {
        Some(hash) => (&query[..hash], &query[hash..]),
        None => (query, ""),
    };
    let mut out = head;
    out.push('?');
    for (i, param) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match param.split_once('=') {
            Some((key, _)) if is_password_key(key) => {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(param),
        }
    }
    out.push_str(fragment);
    out
}

/// Whether a query parameter's name (percent-encoded or not) names a password.
fn is_password_key(key: &str) -> bool {
    let key = percent_decode(key).to_ascii_lowercase();
    let key = key.trim();
    matches!(key, "pass" | "passwd" | "pwd") || key.ends_with("password")
}

/// Decodes `%XX` escapes (and `+` as a space); a malformed escape is kept.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes[i] {
            b'%' => bytes
                .get(i + 1..i + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok()),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, byte) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[cfg(feature = "postgres")]
    #[test]
    fn sqlstate_classes_decide() {
        use super::is_transient_sqlstate as transient;
        for code in [
            "08006", "08P01", "40001", "40P01", "53300", "57P01", "57P03", "25006", "25P03",
            "25P04",
        ] {
            assert!(transient(code), "{code}");
        }
        for code in [
            "23505", "23514", "42601", "42P01", "42501", "22P02", "XX001", "XX002",
            // NUL byte in text, index row too large, an aborted transaction.
            "22021", "54000", "25P02",
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
        // READONLY (and its extended forms) too.
        for code in ["19", "2067", "275", "1", "11", "26", "8", "1032", "x"] {
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

    /// Every shape of credential is hidden, and what is not a credential
    /// (scheme, user, host, port, database, other parameters) is kept.
    #[test]
    fn redacts_every_form_of_credential() {
        // (url, secrets that must vanish, parts that must stay)
        let cases: &[(&str, &[&str], &[&str])] = &[
            ("postgres://u:p@h/db", &[":p@"], &["postgres://", "u:***@h", "/db"]),
            (
                "postgresql://u:p%40x@h:5432/db",
                &["p%40x", "%40x"],
                &["postgresql://u:***@h:5432/db"],
            ),
            (
                "postgres://u@h/db?password=p",
                &["=p"],
                &["postgres://u@h/db?password=***"],
            ),
            (
                "postgres:///db?sslmode=require&password=p&application_name=a",
                &["=p&"],
                &["postgres:///db?sslmode=require&password=***&application_name=a"],
            ),
            (
                "postgres://h/db?user=u&PASSWORD=p",
                &["=p"],
                &["postgres://h/db?user=u&PASSWORD=***"],
            ),
            (
                "postgres://u:s3cr%2Fet@h/db?Pass=s3cr2&passwd=s3cr3&sslpassword=s3cr4&pwd=s3cr5&PGPASSWORD=s3cr6&pass%77ord=s3cr7",
                &["s3cr"],
                &["postgres://u:***@h/db?Pass=***&passwd=***&sslpassword=***&pwd=***&PGPASSWORD=***&pass%77ord=***"],
            ),
            ("sqlite:keiro.db", &[], &["sqlite:keiro.db"]),
            ("sqlite::memory:", &[], &["sqlite::memory:"]),
            (
                "sqlite:k.db?mode=rwc&password=s3cret",
                &["s3cret"],
                &["sqlite:k.db?mode=rwc&password=***"],
            ),
            (
                "postgres://bob:p@ss@word@db.example:5432/keiro?sslmode=require",
                &["ss@word", "p@ss"],
                &["postgres://bob:***@db.example:5432/keiro?sslmode=require"],
            ),
            (
                "postgres://bob:hunter2@db",
                &["hunter2"],
                &["postgres://bob:***@db"],
            ),
            (
                "postgres://db/keiro?application_name=passer&user=bob",
                &[],
                &["postgres://db/keiro?application_name=passer&user=bob"],
            ),
        ];
        for (url, secrets, kept) in cases {
            let redacted = redact(url);
            for secret in *secrets {
                assert!(
                    !redacted.contains(secret),
                    "{url} -> {redacted} still holds {secret}"
                );
            }
            for part in *kept {
                assert!(redacted.contains(part), "{url} -> {redacted} lost {part}");
            }
        }
    }
}
