//! keiro's storage layer: the workflow journal and durable timers on SQLite
//! and PostgreSQL.
//!
//! [`Store`] is the one entry point. It is an enum over the two concrete
//! backends, [`SqliteStore`] and [`PostgresStore`] (each behind the cargo
//! feature of the same name, both on by default). Every operation is written
//! once (`journal`, `resume`, `timers`) on statements spelled once per
//! backend (`sql`) and rows decoded once (`rows`); the backend modules hold
//! only what truly differs: connecting and migrating, batch inserts, claims
//! with `SKIP LOCKED`, `LISTEN`/`NOTIFY`. Migrations are embedded
//! ([`SQLITE_MIGRATOR`], [`POSTGRES_MIGRATOR`]) and run by [`Store::connect`].
//!
//! Steps reach the journal through a [`JournalWriter`], which commits whatever
//! queued while the previous commit was in flight as one transaction.
//!
//! Every time the store reads or writes is microseconds since the Unix epoch
//! ([`Store::now_us`], read from the store's [`Clock`]); migration 0008 converted rows stored in milliseconds before.

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("keiro-store needs a backend: enable the `sqlite` or `postgres` feature (or both)");

/// Runs `$body` once per compiled-in backend, with `$x` bound to the value in
/// the variant of `$enum` ([`Store`] or [`Conn`]) and, in the second form,
/// `$sql` to that backend's [`sql::Statements`]. The body is written once and
/// type-checked against each backend's concrete sqlx types.
macro_rules! dispatch {
    ($enum:ident, $on:expr, |$x:pat_param| $body:expr) => {
        dispatch!($enum, $on, |$x, _| $body)
    };
    ($enum:ident, $on:expr, |$x:pat_param, $sql:pat_param| $body:expr) => {
        match $on {
            #[cfg(feature = "sqlite")]
            $enum::Sqlite($x) => {
                let $sql: &'static $crate::sql::Statements = &$crate::sqlite::SQL;
                $body
            }
            #[cfg(feature = "postgres")]
            $enum::Postgres($x) => {
                let $sql: &'static $crate::sql::Statements = &$crate::postgres::SQL;
                $body
            }
        }
    };
}

#[macro_use]
mod query;
mod clock;
mod debounce;
mod error;
mod events;
mod journal;
mod listing;
mod messages;
mod migrations;
mod model;
mod operate;
mod options;
mod outbox;
mod outcome;
#[cfg(feature = "postgres")]
mod postgres;
mod prepared;
mod queue;
mod resume;
mod retention;
mod rows;
mod schedules;
mod schema;
mod server_clock;
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod step_tx;
mod suspend;
mod timers;
mod validate;
mod versions;
mod warm;
mod writer;

pub use clock::Clock;
pub use debounce::{create_debounced_tx, Debounce};
pub use error::{is_conflict, is_sqlite_rollback_error, redact as redact_url, StoreError};

/// Instance ids up to this many bytes travel as they are in wake
/// notifications; longer ones as their [`wake_payload`] digest (PostgreSQL
/// refuses `NOTIFY` payloads of 8,000 bytes or more).
pub const WAKE_ID_MAX: usize = 200;

/// What a wake notification carries for instance `id`: the id itself when it
/// is at most [`WAKE_ID_MAX`] bytes, else `#` and the 16 hex digits of its
/// 64-bit FNV-1a hash (stable across processes and builds). A listener wakes
/// the waiters whose ids map to the payload.
pub fn wake_payload(id: &str) -> std::borrow::Cow<'_, str> {
    if id.len() <= WAKE_ID_MAX {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    std::borrow::Cow::Owned(format!("#{hash:016x}"))
}
pub use events::{EventRow, Publish, StreamEntry};
pub use journal::StepTiming;
pub use listing::{ListQuery, ListedInstance, WaitingStep};
pub use messages::{
    MessageRow, NewMessage, Receive, Received, SendOutcome, Take, Taken, WaitingMessage,
};
pub use model::{
    now_us, timer_sort_key, AppendOutcome, BlockReason, Blocked, Cancellation, ContinueAsNew,
    Crash, ExecutorRow, Finish, InstanceRow, InstanceStatus, Lease, NewInstance, NewTimer,
    ParentLink, ReasonMatch, Registered, Resolution, ResumeClaimOutcome, ResumeUpdate,
    ScheduleOutcome, StepRow, Suspend, TimerListKind, TimerQuery, TimerRow, TimerStatus,
    TimerUpdate,
};
pub use operate::{Fork, JournalEntry, Retry};
pub use options::{Pooler, SqliteSynchronous, StoreOptions};
pub use outbox::{create_instance_tx, get_step_tx, resolve_tx, send_message_tx};
pub use outcome::Outcome;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, POSTGRES_MIGRATOR};
pub use queue::{create_queued_tx, HandOver, QueueLimits, Queued};
pub use resume::OtherQueueLimits;
pub use retention::{GcCursor, GcPolicy, GcProgress, GcRequest, GcSummary};
pub use schedules::{ScheduleDef, ScheduleRow};
pub use server_clock::ClockReading;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SQLITE_MIGRATOR};
pub use step_tx::StepTx;
pub use timers::{cancel_timer_tx, schedule_timer_once_tx, schedule_timer_tx, TimerTx};
pub use validate::{preview as preview_id, validate_id, validate_id_within, MAX_ID_BYTES};
pub use versions::VersionCount;
pub use writer::{CreateRequest, FinishRequest, JournalWriter, MessageRequest, QueuedRequest};

/// A `Result` whose error is [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A connected, migrated journal store.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded SQLite backend.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// The PostgreSQL backend.
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

/// One connection (or transaction) of either backend, for the operations
/// that run several statements on it.
pub(crate) enum Conn<'c> {
    /// A SQLite connection.
    #[cfg(feature = "sqlite")]
    Sqlite(&'c mut sqlx::SqliteConnection),
    /// A PostgreSQL connection.
    #[cfg(feature = "postgres")]
    Postgres(&'c mut sqlx::PgConnection),
}

#[cfg(feature = "sqlite")]
impl<'c> From<&'c mut sqlx::SqliteConnection> for Conn<'c> {
    fn from(conn: &'c mut sqlx::SqliteConnection) -> Self {
        Conn::Sqlite(conn)
    }
}

#[cfg(feature = "postgres")]
impl<'c> From<&'c mut sqlx::PgConnection> for Conn<'c> {
    fn from(conn: &'c mut sqlx::PgConnection) -> Self {
        Conn::Postgres(conn)
    }
}

impl Store {
    /// Connects to `url` and runs the embedded migrations (or, with
    /// [`StoreOptions::migrate`] `false`, refuses a schema behind this
    /// build's with [`StoreError::NotMigrated`]).
    ///
    /// `sqlite:path` / `sqlite://path` (the file is created if missing) and
    /// `sqlite::memory:` select SQLite; `postgres://…` / `postgresql://…` select
    /// PostgreSQL. Any other scheme, or one whose backend this build left out
    /// (cargo features `sqlite`, `postgres`), is refused with
    /// [`StoreError::InvalidUrl`].
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Store> {
        let missing = |feature: &str| StoreError::InvalidUrl {
            url: error::redact(url),
            reason: format!(
                "this build of keiro-store has no {feature} backend: enable its cargo feature \
                 `{feature}`"
            ),
        };
        let store = Store::open(url, options, missing).await?;
        if !options.migrate {
            if let Err(error) = store.require_migrated(url).await {
                store.close().await;
                return Err(error);
            }
        }
        Ok(store)
    }

    /// Opens the backend `url` names (migrating it when `options` say so).
    async fn open(
        url: &str,
        options: &StoreOptions,
        missing: impl Fn(&str) -> StoreError,
    ) -> Result<Store> {
        if url.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            return Ok(Store::Sqlite(SqliteStore::connect(url, options).await?));
            #[cfg(not(feature = "sqlite"))]
            return Err(missing("sqlite"));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return Ok(Store::Postgres(PostgresStore::connect(url, options).await?));
            #[cfg(not(feature = "postgres"))]
            return Err(missing("postgres"));
        }
        let _ = (options, missing);
        Err(StoreError::InvalidUrl {
            url: error::redact(url),
            reason: "expected a URL starting with `sqlite:`, `postgres://` or `postgresql://`"
                .into(),
        })
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "postgres",
        }
    }

    /// Wakes resume workers and waiters on instance `id` (empty: none in
    /// particular) in other processes (PostgreSQL `NOTIFY`; SQLite ones share
    /// the process and are woken in memory). The notification carries
    /// [`wake_payload`]`(id)`, short whatever the id's length. It is a hint:
    /// callers that committed their work log an error here and carry on.
    pub async fn wake_workers(&self, id: &str) -> Result<()> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => {
                let _ = id;
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.wake_workers(id).await,
        }
    }

    /// The clock this store reads "now" from ([`StoreOptions::clock`]).
    pub fn clock(&self) -> &Clock {
        dispatch!(Store, self, |s| &s.clock)
    }

    /// Now by [`Store::clock`], in µs since the Unix epoch.
    #[inline]
    pub fn now_us(&self) -> i64 {
        self.clock().now_us()
    }

    /// Closes the connection pool.
    pub async fn close(&self) {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => s.close().await,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.close().await,
        }
    }
}
