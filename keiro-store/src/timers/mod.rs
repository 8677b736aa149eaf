//! Durable timers: one row per timer, claimed by workers, fired through a
//! caller's action, requeued when a claim goes stale, dead-lettered when it
//! keeps failing.
//!
//! This is the storage half; `keiro::timers` wraps it with typed ids, JSON
//! payloads, the worker loop and metrics. Everything here speaks the store's
//! units: ids are strings, payloads are JSON text, times are milliseconds since
//! the Unix epoch. Operations whose outcome depends on the clock take `now`
//! explicitly, so a caller (or a test) decides what "due" means.
//!
//! A timer's life:
//!
//! ```text
//! scheduled --claim--> firing --mark fired--> fired
//!     ^                  |  \--dead letter--> dead --claim for resume--> resuming
//!     |                  |                     ^                          |  |  |
//!     +--reschedule / requeue (stale claim)----+ (requeue by id)    park -+  |  +- cancel -> cancelled
//!                                                                 complete --+-> fired
//! ```
//!
//! `cancel` ends a scheduled, firing or dead timer. A `resuming` timer is held
//! by a guarded foreground claim: only the holder of its token moves it on, and
//! every id-only mutation answers [`TimerUpdate::Guarded`]. A claim whose lease
//! lapses goes back to `dead` with its reason and attempts intact.

mod postgres;
mod sqlite;

use sqlx::{Postgres, Sqlite, Transaction};

use crate::{Result, Store, StoreError};

/// Where a timer stands, as stored in its row's `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimerStatus {
    /// Waiting for its fire time; a worker claims it once due.
    Scheduled,
    /// Claimed by a worker whose fire action is running (or crashed while
    /// running: a stale claim is requeued after the worker's timeout).
    Firing,
    /// Fired: the action completed and recorded the event it produced.
    Fired,
    /// Dead-lettered: it failed permanently or hit the attempt ceiling.
    /// It stays here, with its reason, until an operator requeues, resumes or
    /// cancels it.
    Dead,
    /// Cancelled before it fired.
    Cancelled,
    /// A dead timer held by a guarded foreground resume claim.
    Resuming,
}

impl TimerStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [TimerStatus; 6] = [
        TimerStatus::Scheduled,
        TimerStatus::Firing,
        TimerStatus::Fired,
        TimerStatus::Dead,
        TimerStatus::Cancelled,
        TimerStatus::Resuming,
    ];

    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            TimerStatus::Scheduled => "scheduled",
            TimerStatus::Firing => "firing",
            TimerStatus::Fired => "fired",
            TimerStatus::Dead => "dead",
            TimerStatus::Cancelled => "cancelled",
            TimerStatus::Resuming => "resuming",
        }
    }

    /// Parses the `status` column.
    pub fn parse(text: &str) -> Option<TimerStatus> {
        TimerStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the timer is done for good (fired or cancelled).
    pub fn is_final(self) -> bool {
        matches!(self, TimerStatus::Fired | TimerStatus::Cancelled)
    }
}

impl std::fmt::Display for TimerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A timer to schedule.
#[derive(Debug, Clone, Copy)]
pub struct NewTimer<'a> {
    /// The timer's id, chosen by the caller; scheduling is idempotent on it.
    pub id: &'a str,
    /// The process manager (or other owner) the timer belongs to. Workers
    /// route on it, and it labels metrics, so keep the set of names bounded.
    pub process_manager: &'a str,
    /// What the timer is about (a saga, an order, a session): free text.
    pub correlation_id: &'a str,
    /// When it is due (ms since the Unix epoch).
    pub fire_at: i64,
    /// JSON text handed to the fire action. The store refuses text that is not JSON.
    pub payload: &'a str,
}

/// A stored timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerRecord {
    /// The timer's id.
    pub id: String,
    /// The process manager it belongs to.
    pub process_manager: String,
    /// What it is about.
    pub correlation_id: String,
    /// When it is due (ms since the Unix epoch).
    pub fire_at: i64,
    /// The JSON payload, as text.
    pub payload: String,
    /// Where it stands.
    pub status: TimerStatus,
    /// How many times a worker has claimed it.
    pub attempts: i64,
    /// The latest diagnostic: a retry note, a dead-letter reason.
    pub last_error: Option<String>,
    /// The event its firing produced, once fired.
    pub event_id: Option<String>,
    /// When the current (or last) worker claim was taken (ms since the Unix epoch).
    pub claimed_at: Option<i64>,
    /// While `resuming`: when the foreground claim lapses (ms since the Unix epoch).
    pub resume_lease_until: Option<i64>,
    /// When the row was created (ms since the Unix epoch).
    pub created_at: i64,
    /// When the row last changed (ms since the Unix epoch).
    pub updated_at: i64,
}

/// What [`Store::schedule_timer`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// A new timer was recorded.
    Created,
    /// A scheduled timer with this id was re-armed with the new fire time and payload.
    Updated,
    /// A timer with this id exists and is past `scheduled` (firing, fired, dead,
    /// cancelled, resuming); it was left as it is.
    Unchanged(TimerStatus),
}

/// What an id-only timer mutation did.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerUpdate {
    /// It applied; the row as it is now.
    Applied(TimerRecord),
    /// No timer has this id.
    Missing,
    /// The timer's status does not allow it; nothing changed.
    NotApplicable(TimerStatus),
    /// A guarded foreground resume claim holds the timer (until the given ms
    /// since the Unix epoch); only its holder may move it. Nothing changed.
    Guarded {
        /// When the claim lapses unless renewed.
        lease_until: i64,
    },
}

impl TimerUpdate {
    /// Whether the mutation applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, TimerUpdate::Applied(_))
    }
}

/// What [`Store::claim_dead_timer`] did.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeClaimOutcome {
    /// The timer is now `resuming`, held by the given token.
    Claimed(TimerRecord),
    /// No timer has this id.
    Missing,
    /// The timer is not dead; nothing changed.
    NotDead(TimerStatus),
    /// Another foreground claim holds it until the given ms since the Unix epoch.
    Held {
        /// When that claim lapses unless renewed.
        lease_until: i64,
    },
}

/// What a token-guarded resume operation did.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeUpdate {
    /// It applied; the row as it is now.
    Applied(TimerRecord),
    /// The token no longer holds the timer: the lease lapsed, another claim took
    /// it, or it was never this token's. Carries the timer's status now (`None`
    /// when the timer is gone). Nothing changed.
    Lost(Option<TimerStatus>),
}

/// Which timers [`Store::find_timers`] lists, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerListKind {
    /// `scheduled` timers, by `(fire_at, id)`.
    Pending {
        /// Only timers due at or before this time, when set.
        due_by: Option<i64>,
    },
    /// `firing` timers claimed at or before `claimed_by`, by `(claimed_at, id)`.
    Stuck {
        /// The newest claim time counted as stuck.
        claimed_by: i64,
    },
    /// `dead` timers, by `(updated_at, id)`: the order they were dead-lettered.
    Dead,
}

/// How a timer's `last_error` must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonMatch<'a> {
    /// Exactly this text.
    Exact(&'a str),
    /// Containing this text (case-sensitive).
    Contains(&'a str),
}

/// One page of [`Store::find_timers`]: a keyset page, stable under concurrent
/// inserts (each row's position depends only on its own key).
#[derive(Debug, Clone, Copy)]
pub struct TimerQuery<'a> {
    /// Which timers.
    pub kind: TimerListKind,
    /// Only this process manager's, when set.
    pub process_manager: Option<&'a str>,
    /// Only those whose `last_error` matches, when set.
    pub reason: Option<ReasonMatch<'a>>,
    /// Only rows after this `(sort key, id)`: the last row of the previous page.
    pub after: Option<(i64, &'a str)>,
    /// At most this many rows.
    pub limit: i64,
}

/// The sort key of `record` in a listing of `kind`: the first half of the
/// keyset `(key, id)`.
pub fn timer_sort_key(kind: TimerListKind, record: &TimerRecord) -> i64 {
    match kind {
        TimerListKind::Pending { .. } => record.fire_at,
        TimerListKind::Stuck { .. } => record.claimed_at.unwrap_or(0),
        TimerListKind::Dead => record.updated_at,
    }
}

/// A transaction of the caller's, on either backend, that a timer write joins.
///
/// Built with `.into()` from `&mut sqlx::Transaction<'_, Sqlite>` or
/// `&mut sqlx::Transaction<'_, Postgres>`; the transaction stays the caller's
/// to commit or roll back.
#[derive(Debug)]
pub enum TimerTx<'t, 'c> {
    /// A SQLite transaction. Begin it with `BEGIN IMMEDIATE`
    /// (`pool.begin_with("BEGIN IMMEDIATE")`) so its reads and writes cannot
    /// be interleaved with another writer's.
    Sqlite(&'t mut Transaction<'c, Sqlite>),
    /// A PostgreSQL transaction.
    Postgres(&'t mut Transaction<'c, Postgres>),
}

impl<'t, 'c> From<&'t mut Transaction<'c, Sqlite>> for TimerTx<'t, 'c> {
    fn from(tx: &'t mut Transaction<'c, Sqlite>) -> Self {
        TimerTx::Sqlite(tx)
    }
}

impl<'t, 'c> From<&'t mut Transaction<'c, Postgres>> for TimerTx<'t, 'c> {
    fn from(tx: &'t mut Transaction<'c, Postgres>) -> Self {
        TimerTx::Postgres(tx)
    }
}

/// Schedules a timer inside the caller's transaction: it exists exactly when
/// that transaction commits. Same semantics as [`Store::schedule_timer`].
pub async fn schedule_timer_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    timer: &NewTimer<'_>,
) -> Result<ScheduleOutcome>
where
    'c: 't,
{
    match tx.into() {
        TimerTx::Sqlite(tx) => sqlite::schedule(tx, timer, false).await,
        TimerTx::Postgres(tx) => postgres::schedule(tx, timer, false).await,
    }
}

/// Schedules a timer inside the caller's transaction unless one with its id
/// exists (whatever its status). Returns whether it was created.
pub async fn schedule_timer_once_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    timer: &NewTimer<'_>,
) -> Result<bool>
where
    'c: 't,
{
    let outcome = match tx.into() {
        TimerTx::Sqlite(tx) => sqlite::schedule(tx, timer, true).await?,
        TimerTx::Postgres(tx) => postgres::schedule(tx, timer, true).await?,
    };
    Ok(outcome == ScheduleOutcome::Created)
}

/// Cancels a timer inside the caller's transaction. Same semantics as
/// [`Store::cancel_timer`].
pub async fn cancel_timer_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    id: &str,
) -> Result<TimerUpdate>
where
    'c: 't,
{
    match tx.into() {
        TimerTx::Sqlite(tx) => sqlite::cancel(tx, id).await,
        TimerTx::Postgres(tx) => postgres::cancel(tx, id).await,
    }
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            Store::Sqlite($store) => $body,
            Store::Postgres($store) => $body,
        }
    };
}

impl Store {
    /// Schedules a timer. A new id is recorded ([`ScheduleOutcome::Created`]);
    /// a `scheduled` timer with this id is re-armed with the new fire time,
    /// payload, process manager and correlation id, keeping its attempts
    /// ([`ScheduleOutcome::Updated`]); a timer past `scheduled` is left alone.
    /// On PostgreSQL a new or moved timer notifies sleeping workers
    /// ([`crate::PostgresStore::listen_timers`]).
    pub async fn schedule_timer(&self, timer: &NewTimer<'_>) -> Result<ScheduleOutcome> {
        dispatch!(self, s => s.schedule_timer(timer, false).await)
    }

    /// Schedules a timer unless one with its id exists, whatever its status:
    /// the first schedule wins. Returns whether it was created.
    pub async fn schedule_timer_once(&self, timer: &NewTimer<'_>) -> Result<bool> {
        let outcome = dispatch!(self, s => s.schedule_timer(timer, true).await)?;
        Ok(outcome == ScheduleOutcome::Created)
    }

    /// Claims the earliest due timer (`scheduled`, `fire_at <= now`, ties by
    /// id): it becomes `firing`, its attempts go up by one and `claimed_at`
    /// becomes `now`. Concurrent claimers never get the same timer
    /// (`FOR UPDATE SKIP LOCKED` on PostgreSQL, the single writer on SQLite).
    pub async fn claim_due_timer(&self, now: i64) -> Result<Option<TimerRecord>> {
        dispatch!(self, s => s.claim_due_timer(now).await)
    }

    /// The earliest fire time of any `scheduled` timer, due or not: how long
    /// an idle worker may sleep before something is due.
    pub async fn next_timer_fire_at(&self) -> Result<Option<i64>> {
        dispatch!(self, s => s.next_timer_fire_at().await)
    }

    /// Reads one timer.
    pub async fn get_timer(&self, id: &str) -> Result<Option<TimerRecord>> {
        dispatch!(self, s => s.get_timer(id).await)
    }

    /// Marks a `firing` timer fired with the id of the event its firing produced.
    pub async fn mark_timer_fired(&self, id: &str, event_id: &str) -> Result<TimerUpdate> {
        dispatch!(self, s => s.mark_timer_fired(id, event_id).await)
    }

    /// How many timers are due at `now` and not yet claimed.
    pub async fn count_due_timers(&self, now: i64) -> Result<u64> {
        dispatch!(self, s => s.count_due_timers(now).await)
    }

    /// How many timers are `firing` under a claim taken at or before
    /// `claimed_by`, optionally only one process manager's.
    pub async fn count_stuck_timers(
        &self,
        claimed_by: i64,
        process_manager: Option<&str>,
    ) -> Result<u64> {
        dispatch!(self, s => s.count_stuck_timers(claimed_by, process_manager).await)
    }

    /// Moves every `firing` timer claimed at or before `claimed_by` back to
    /// `scheduled` (fire time and attempts kept). Returns how many.
    pub async fn requeue_stuck_timers(&self, claimed_by: i64) -> Result<u64> {
        dispatch!(self, s => s.requeue_stuck_timers(claimed_by).await)
    }

    /// Puts one timer back in line: a `firing` one keeps its attempts (the
    /// ceiling counts every claim); a `dead` one starts over with zero
    /// attempts, its reason kept for the record. Its fire time is unchanged.
    pub async fn requeue_timer(&self, id: &str) -> Result<TimerUpdate> {
        dispatch!(self, s => s.requeue_timer(id).await)
    }

    /// Moves a `firing` (claimed) or `scheduled` timer to `fire_at` in one
    /// statement, keeping its attempts, and records `note` as its latest
    /// diagnostic when given.
    pub async fn reschedule_timer(
        &self,
        id: &str,
        fire_at: i64,
        note: Option<&str>,
    ) -> Result<TimerUpdate> {
        dispatch!(self, s => s.reschedule_timer(id, fire_at, note).await)
    }

    /// Cancels a `scheduled`, `firing` or `dead` timer.
    pub async fn cancel_timer(&self, id: &str) -> Result<TimerUpdate> {
        dispatch!(self, s => s.cancel_timer(id).await)
    }

    /// Dead-letters a `scheduled` or `firing` timer with `reason`, keeping its
    /// attempts.
    pub async fn dead_letter_timer(&self, id: &str, reason: &str) -> Result<TimerUpdate> {
        dispatch!(self, s => s.dead_letter_timer(id, reason).await)
    }

    /// One keyset page of pending, stuck or dead timers.
    pub async fn find_timers(&self, query: &TimerQuery<'_>) -> Result<Vec<TimerRecord>> {
        dispatch!(self, s => s.find_timers(query).await)
    }

    /// Takes a guarded foreground claim on a `dead` timer (or on a `resuming`
    /// one whose claim lapsed at or before `now`): it becomes `resuming`, held
    /// by `token` until `lease_until`. Reason and attempts are kept.
    pub async fn claim_dead_timer(
        &self,
        id: &str,
        token: &str,
        lease_until: i64,
        now: i64,
    ) -> Result<ResumeClaimOutcome> {
        dispatch!(self, s => s.claim_dead_timer(id, token, lease_until, now).await)
    }

    /// Extends a live resume claim to `lease_until`.
    pub async fn renew_timer_resume(
        &self,
        id: &str,
        token: &str,
        lease_until: i64,
        now: i64,
    ) -> Result<ResumeUpdate> {
        dispatch!(self, s => s.resume_transition(id, token, now, ResumeEnd::Renew { lease_until }).await)
    }

    /// Ends a live resume claim as fired with `event_id`.
    pub async fn complete_timer_resume(
        &self,
        id: &str,
        token: &str,
        event_id: &str,
        now: i64,
    ) -> Result<ResumeUpdate> {
        dispatch!(self, s => s.resume_transition(id, token, now, ResumeEnd::Complete { event_id }).await)
    }

    /// Ends a live resume claim by putting the timer back to `dead`, with
    /// `reason` as its diagnostic when given (else the old one is kept).
    pub async fn park_timer_resume(
        &self,
        id: &str,
        token: &str,
        reason: Option<&str>,
        now: i64,
    ) -> Result<ResumeUpdate> {
        dispatch!(self, s => s.resume_transition(id, token, now, ResumeEnd::Park { reason }).await)
    }

    /// Ends a live resume claim by cancelling the timer.
    pub async fn cancel_timer_resume(
        &self,
        id: &str,
        token: &str,
        now: i64,
    ) -> Result<ResumeUpdate> {
        dispatch!(self, s => s.resume_transition(id, token, now, ResumeEnd::Cancel).await)
    }

    /// Moves every `resuming` timer whose claim lapsed at or before `now` back
    /// to `dead`, keeping its reason and attempts. Returns how many.
    pub async fn recover_expired_timer_resumes(&self, now: i64) -> Result<u64> {
        dispatch!(self, s => s.recover_expired_timer_resumes(now).await)
    }
}

/// How a token-guarded resume operation moves a `resuming` timer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ResumeEnd<'a> {
    Renew { lease_until: i64 },
    Complete { event_id: &'a str },
    Park { reason: Option<&'a str> },
    Cancel,
}

pub(crate) fn record_from_row<'r, R>(row: &'r R) -> Result<TimerRecord>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let id: String = row
        .try_get("id")
        .map_err(|e| corrupt("a timer".into(), "id", e))?;
    let what = || format!("timer `{id}`");
    let status: String = row
        .try_get("status")
        .map_err(|e| corrupt(what(), "status", e))?;
    let status = parse_status(&id, &status)?;
    macro_rules! get {
        ($column:literal) => {
            row.try_get($column)
                .map_err(|e| corrupt(what(), $column, e))?
        };
    }
    Ok(TimerRecord {
        process_manager: get!("process_manager"),
        correlation_id: get!("correlation_id"),
        fire_at: get!("fire_at"),
        payload: get!("payload"),
        status,
        attempts: get!("attempts"),
        last_error: get!("last_error"),
        event_id: get!("event_id"),
        claimed_at: get!("claimed_at"),
        resume_lease_until: get!("resume_lease_until"),
        created_at: get!("created_at"),
        updated_at: get!("updated_at"),
        id,
    })
}

fn parse_status(id: &str, text: &str) -> Result<TimerStatus> {
    TimerStatus::parse(text).ok_or_else(|| StoreError::Corrupt {
        what: format!("timer `{id}` has unknown status `{text}`"),
    })
}

fn corrupt(what: String, column: &str, e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        what: format!("{what}: column `{column}` could not be read: {e}"),
    }
}

/// Why an id-only mutation did not apply, from the row's `(status,
/// resume_lease_until)` read after the update matched nothing.
fn diagnose(id: &str, found: Option<(String, Option<i64>)>) -> Result<TimerUpdate> {
    let Some((status, lease_until)) = found else {
        return Ok(TimerUpdate::Missing);
    };
    Ok(match parse_status(id, &status)? {
        TimerStatus::Resuming => TimerUpdate::Guarded {
            lease_until: lease_until.unwrap_or(0),
        },
        other => TimerUpdate::NotApplicable(other),
    })
}

/// Why a dead-timer claim did not apply, from the row's `(status,
/// resume_lease_until)`.
fn diagnose_claim(id: &str, found: Option<(String, Option<i64>)>) -> Result<ResumeClaimOutcome> {
    let Some((status, lease_until)) = found else {
        return Ok(ResumeClaimOutcome::Missing);
    };
    Ok(match parse_status(id, &status)? {
        TimerStatus::Resuming => ResumeClaimOutcome::Held {
            lease_until: lease_until.unwrap_or(0),
        },
        other => ResumeClaimOutcome::NotDead(other),
    })
}

fn diagnose_resume(id: &str, found: Option<(String, Option<i64>)>) -> Result<ResumeUpdate> {
    Ok(ResumeUpdate::Lost(
        found
            .map(|(status, _)| parse_status(id, &status))
            .transpose()?,
    ))
}
