//! Durable timers: one row per timer, claimed by workers, fired through a
//! caller's action, requeued when a claim goes stale, dead-lettered when it
//! keeps failing.
//!
//! This is the storage half; `keiro::timers` wraps it with typed ids, JSON
//! payloads, the worker loop and metrics. Everything here speaks the store's
//! units: ids are strings, payloads are JSON text, times are microseconds since
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
//!
//! Every operation is written once, on both backends; they differ only in
//! the statements' spelling (`sql`) and in how a schedule runs (in a
//! transaction of its own on SQLite, notifying as it writes on PostgreSQL).

use sqlx::QueryBuilder;

use crate::model::ResumeEnd;
use crate::query::{Arg, Session, Statement};
use crate::rows::FromRow;
use crate::sql::TIMER_COLUMNS;
use crate::validate::validate_id;
use crate::{
    rows, Conn, NewTimer, ReasonMatch, Result, ResumeClaimOutcome, ResumeUpdate, ScheduleOutcome,
    Store, StoreError, TimerListKind, TimerQuery, TimerRow, TimerStatus, TimerUpdate,
};

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
    #[cfg(feature = "sqlite")]
    Sqlite(&'t mut sqlx::Transaction<'c, sqlx::Sqlite>),
    /// A PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    Postgres(&'t mut sqlx::Transaction<'c, sqlx::Postgres>),
}

#[cfg(feature = "sqlite")]
impl<'t, 'c> From<&'t mut sqlx::Transaction<'c, sqlx::Sqlite>> for TimerTx<'t, 'c> {
    fn from(tx: &'t mut sqlx::Transaction<'c, sqlx::Sqlite>) -> Self {
        TimerTx::Sqlite(tx)
    }
}

#[cfg(feature = "postgres")]
impl<'t, 'c> From<&'t mut sqlx::Transaction<'c, sqlx::Postgres>> for TimerTx<'t, 'c> {
    fn from(tx: &'t mut sqlx::Transaction<'c, sqlx::Postgres>) -> Self {
        TimerTx::Postgres(tx)
    }
}

impl<'t> From<TimerTx<'t, '_>> for Conn<'t> {
    fn from(tx: TimerTx<'t, '_>) -> Self {
        match tx {
            #[cfg(feature = "sqlite")]
            TimerTx::Sqlite(tx) => Conn::Sqlite(tx),
            #[cfg(feature = "postgres")]
            TimerTx::Postgres(tx) => Conn::Postgres(tx),
        }
    }
}

/// Schedules a timer inside the caller's transaction: it exists exactly when
/// that transaction commits. Same semantics as [`Store::schedule_timer`],
/// stamped at `now` (µs since the Unix epoch: the caller's clock, which
/// [`Store::now_us`] reads for a store).
pub async fn schedule_timer_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    timer: &NewTimer<'_>,
    now: i64,
) -> Result<ScheduleOutcome>
where
    'c: 't,
{
    schedule(tx.into().into(), timer, false, now).await
}

/// Schedules a timer inside the caller's transaction unless one with its id
/// exists (whatever its status), stamped at `now`. Returns whether it was
/// created.
pub async fn schedule_timer_once_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    timer: &NewTimer<'_>,
    now: i64,
) -> Result<bool>
where
    'c: 't,
{
    let outcome = schedule(tx.into().into(), timer, true, now).await?;
    Ok(outcome == ScheduleOutcome::Created)
}

/// Cancels a timer inside the caller's transaction, stamped at `now`. Same
/// semantics as [`Store::cancel_timer`].
pub async fn cancel_timer_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    id: &str,
    now: i64,
) -> Result<TimerUpdate>
where
    'c: 't,
{
    let args = args![id, now];
    update(
        tx.into().into(),
        "cancel_timer",
        id,
        |sql| &sql.cancel_timer,
        &args,
    )
    .await
}

impl Store {
    /// Schedules a timer. A new id is recorded ([`ScheduleOutcome::Created`]);
    /// a `scheduled` timer with this id is re-armed with the new fire time,
    /// payload, process manager and correlation id, keeping its attempts
    /// ([`ScheduleOutcome::Updated`]); a timer past `scheduled` is left alone.
    /// On PostgreSQL a new or moved timer notifies sleeping workers
    /// ([`crate::PostgresStore::listen_timers`]).
    pub async fn schedule_timer(&self, timer: &NewTimer<'_>) -> Result<ScheduleOutcome> {
        self.schedule(timer, false).await
    }

    /// Schedules a timer unless one with its id exists, whatever its status:
    /// the first schedule wins. Returns whether it was created.
    pub async fn schedule_timer_once(&self, timer: &NewTimer<'_>) -> Result<bool> {
        Ok(self.schedule(timer, true).await? == ScheduleOutcome::Created)
    }

    async fn schedule(&self, timer: &NewTimer<'_>, once: bool) -> Result<ScheduleOutcome> {
        const OP: &str = "schedule_timer";
        match self {
            // One writer: the insert, the re-arm and the status read run in
            // one `BEGIN IMMEDIATE` transaction and see one state.
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => {
                let mut tx = s.begin(OP).await?;
                let outcome = schedule((&mut *tx).into(), timer, once, self.now_us()).await?;
                tx.commit().await.map_err(StoreError::query(OP))?;
                Ok(outcome)
            }
            // Each statement re-checks the row and notifies as it writes.
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let mut conn = s.acquire(OP).await?;
                let outcome = schedule((&mut *conn).into(), timer, once, self.now_us()).await?;
                conn.done(OP).await?;
                Ok(outcome)
            }
        }
    }

    /// Claims the earliest due timer (`scheduled`, `fire_at <= now`, ties by
    /// id): it becomes `firing`, its attempts go up by one and `claimed_at`
    /// becomes `now`. Concurrent claimers never get the same timer
    /// (`FOR UPDATE SKIP LOCKED` on PostgreSQL, the single writer on SQLite).
    pub async fn claim_due_timer(&self, now: i64) -> Result<Option<TimerRow>> {
        let args = args![now, self.now_us()];
        self.fetch_optional("claim_due_timer", |sql| &sql.claim_due_timer, &args)
            .await
    }

    /// The earliest fire time of any `scheduled` timer, due or not: how long
    /// an idle worker may sleep before something is due.
    pub async fn next_timer_fire_at(&self) -> Result<Option<i64>> {
        dispatch!(Store, self, |s, sql| crate::prepared::query_scalar(
            &sql.next_timer_fire_at
        )
        .fetch_one(s.exec())
        .await)
        .map_err(StoreError::query("next_timer_fire_at"))
    }

    /// Reads one timer.
    pub async fn get_timer(&self, id: &str) -> Result<Option<TimerRow>> {
        self.fetch_optional("get_timer", |sql| &sql.get_timer, &args![id])
            .await
    }

    /// Marks a `firing` timer fired with the id of the event its firing produced.
    pub async fn mark_timer_fired(&self, id: &str, event_id: &str) -> Result<TimerUpdate> {
        let args = args![id, event_id, self.now_us()];
        self.update_timer("mark_timer_fired", id, |sql| &sql.mark_timer_fired, &args)
            .await
    }

    /// How many timers are due at `now` and not yet claimed.
    pub async fn count_due_timers(&self, now: i64) -> Result<u64> {
        let args = args![now];
        self.count("count_due_timers", |sql| &sql.count_due_timers, &args)
            .await
    }

    /// How many timers are `firing` under a claim taken at or before
    /// `claimed_by`, optionally only one process manager's.
    pub async fn count_stuck_timers(
        &self,
        claimed_by: i64,
        process_manager: Option<&str>,
    ) -> Result<u64> {
        let args = args![claimed_by, process_manager];
        self.count("count_stuck_timers", |sql| &sql.count_stuck_timers, &args)
            .await
    }

    /// Moves every `firing` timer claimed at or before `claimed_by` back to
    /// `scheduled` (fire time and attempts kept). Returns how many.
    pub async fn requeue_stuck_timers(&self, claimed_by: i64) -> Result<u64> {
        let args = args![claimed_by, self.now_us()];
        let op = "requeue_stuck_timers";
        self.execute(op, |sql| &sql.requeue_stuck_timers, &args)
            .await
    }

    /// Puts one timer back in line: a `firing` one keeps its attempts (the
    /// ceiling counts every claim); a `dead` one starts over with zero
    /// attempts, its reason kept for the record. Its fire time is unchanged.
    pub async fn requeue_timer(&self, id: &str) -> Result<TimerUpdate> {
        let args = args![id, self.now_us()];
        self.update_timer("requeue_timer", id, |sql| &sql.requeue_timer, &args)
            .await
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
        let args = args![id, fire_at, note, self.now_us()];
        self.update_timer("reschedule_timer", id, |sql| &sql.reschedule_timer, &args)
            .await
    }

    /// Cancels a `scheduled`, `firing` or `dead` timer.
    pub async fn cancel_timer(&self, id: &str) -> Result<TimerUpdate> {
        let args = args![id, self.now_us()];
        self.update_timer("cancel_timer", id, |sql| &sql.cancel_timer, &args)
            .await
    }

    /// Dead-letters a `scheduled` or `firing` timer with `reason`, keeping its
    /// attempts.
    pub async fn dead_letter_timer(&self, id: &str, reason: &str) -> Result<TimerUpdate> {
        let args = args![id, reason, self.now_us()];
        self.update_timer("dead_letter_timer", id, |sql| &sql.dead_letter_timer, &args)
            .await
    }

    /// One keyset page of pending, stuck or dead timers.
    pub async fn find_timers(&self, query: &TimerQuery<'_>) -> Result<Vec<TimerRow>> {
        let (status, key) = match query.kind {
            TimerListKind::Pending { .. } => ("scheduled", "fire_at"),
            TimerListKind::Stuck { .. } => ("firing", "claimed_at"),
            TimerListKind::Dead => ("dead", "updated_at"),
        };
        dispatch!(Store, self, |s, sql| {
            let mut list = QueryBuilder::new(format!(
                "SELECT {TIMER_COLUMNS} FROM {} WHERE status = '{status}'",
                sql.timers_table
            ));
            match query.kind {
                TimerListKind::Pending { due_by: Some(due) } => {
                    list.push(" AND fire_at <= ").push_bind(due);
                }
                TimerListKind::Stuck { claimed_by } => {
                    list.push(" AND claimed_at <= ").push_bind(claimed_by);
                }
                _ => {}
            }
            if let Some(pm) = query.process_manager {
                list.push(" AND process_manager = ").push_bind(pm);
            }
            match query.reason {
                Some(ReasonMatch::Exact(text)) => {
                    list.push(" AND last_error = ").push_bind(text);
                }
                Some(ReasonMatch::Contains(text)) => {
                    list.push(format!(" AND {}(last_error, ", sql.find_text))
                        .push_bind(text)
                        .push(") > 0");
                }
                None => {}
            }
            if let Some((after_key, after_id)) = query.after {
                list.push(format!(" AND ({key}, id) > ("))
                    .push_bind(after_key)
                    .push(", ")
                    .push_bind(after_id)
                    .push(")");
            }
            list.push(format!(" ORDER BY {key}, id LIMIT "))
                .push_bind(query.limit);
            let rows = crate::prepared::built(list.build())
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query("find_timers"))?;
            rows.iter().map(TimerRow::from_row).collect()
        })
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
        const OP: &str = "claim_dead_timer";
        let args = args![id, token, lease_until, now, self.now_us()];
        let (row, found) = self
            .returning(OP, id, |sql| &sql.claim_dead_timer, &args)
            .await?;
        let Some(row) = row else {
            return match found {
                None => Ok(ResumeClaimOutcome::Missing),
                Some((TimerStatus::Resuming, lease_until)) => Ok(ResumeClaimOutcome::Held {
                    lease_until: lease_until.unwrap_or(0),
                }),
                Some((other, _)) => Ok(ResumeClaimOutcome::NotDead(other)),
            };
        };
        Ok(ResumeClaimOutcome::Claimed(row))
    }

    /// Extends a live resume claim to `lease_until`.
    pub async fn renew_timer_resume(
        &self,
        id: &str,
        token: &str,
        lease_until: i64,
        now: i64,
    ) -> Result<ResumeUpdate> {
        self.resume_transition(id, token, now, ResumeEnd::Renew { lease_until })
            .await
    }

    /// Ends a live resume claim as fired with `event_id`.
    pub async fn complete_timer_resume(
        &self,
        id: &str,
        token: &str,
        event_id: &str,
        now: i64,
    ) -> Result<ResumeUpdate> {
        self.resume_transition(id, token, now, ResumeEnd::Complete { event_id })
            .await
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
        self.resume_transition(id, token, now, ResumeEnd::Park { reason })
            .await
    }

    /// Ends a live resume claim by cancelling the timer.
    pub async fn cancel_timer_resume(
        &self,
        id: &str,
        token: &str,
        now: i64,
    ) -> Result<ResumeUpdate> {
        self.resume_transition(id, token, now, ResumeEnd::Cancel)
            .await
    }

    /// Moves every `resuming` timer whose claim lapsed at or before `now` back
    /// to `dead`, keeping its reason and attempts. Returns how many.
    pub async fn recover_expired_timer_resumes(&self, now: i64) -> Result<u64> {
        let args = args![now, self.now_us()];
        let op = "recover_expired_timer_resumes";
        self.execute(op, |sql| &sql.recover_expired_timer_resumes, &args)
            .await
    }

    /// Runs a token-guarded `UPDATE .. RETURNING` of a `resuming` timer.
    async fn resume_transition(
        &self,
        id: &str,
        token: &str,
        now: i64,
        end: ResumeEnd<'_>,
    ) -> Result<ResumeUpdate> {
        let (statement, value): (Statement, Arg<'_>) = match end {
            ResumeEnd::Renew { lease_until } => (|sql| &sql.renew_timer_resume, lease_until.into()),
            ResumeEnd::Complete { event_id } => (|sql| &sql.complete_timer_resume, event_id.into()),
            ResumeEnd::Park { reason } => (|sql| &sql.park_timer_resume, reason.into()),
            ResumeEnd::Cancel => (|sql| &sql.cancel_timer_resume, None::<&str>.into()),
        };
        let args = args![id, token, now, value, self.now_us()];
        let (row, found) = self.returning("timer_resume", id, statement, &args).await?;
        Ok(match row {
            Some(row) => ResumeUpdate::Applied(row),
            None => ResumeUpdate::Lost(found.map(|(status, _)| status)),
        })
    }

    /// Runs an id-only `UPDATE .. RETURNING` and says why it did not apply
    /// when it matched nothing.
    async fn update_timer(
        &self,
        op: &'static str,
        id: &str,
        statement: Statement,
        args: &[Arg<'_>],
    ) -> Result<TimerUpdate> {
        dispatch!(Store, self, |s| {
            let _turn = s.write_turn().await;
            let mut conn = s.acquire(op).await?;
            let updated = update((&mut *conn).into(), op, id, statement, args).await?;
            conn.done(op).await?;
            Ok(updated)
        })
    }

    /// Runs an `UPDATE .. RETURNING` of timer `id`; when it matched
    /// nothing, also reads the timer's status and resume lease (`None`: no
    /// such timer) on the same connection.
    async fn returning(
        &self,
        op: &'static str,
        id: &str,
        statement: Statement,
        args: &[Arg<'_>],
    ) -> Result<(Option<TimerRow>, Option<(TimerStatus, Option<i64>)>)> {
        dispatch!(Store, self, |s| {
            let _turn = s.write_turn().await;
            let mut conn = s.acquire(op).await?;
            let found = returning_on((&mut *conn).into(), op, id, statement, args).await?;
            conn.done(op).await?;
            Ok(found)
        })
    }
}

/// Inserts or re-arms a timer on `conn` (a transaction of the caller's, or
/// the store's own), `now` being its creation or update time.
///
/// An empty or NUL-holding id or process manager, or one longer than
/// [`crate::MAX_ID_BYTES`] (and a correlation id with a NUL byte or over that
/// length) is refused with [`StoreError::InvalidId`] before anything runs.
async fn schedule(
    conn: Conn<'_>,
    timer: &NewTimer<'_>,
    once: bool,
    now: i64,
) -> Result<ScheduleOutcome> {
    const OP: &str = "schedule_timer";
    validate_id("timer id", timer.id)?;
    validate_id("timer process manager", timer.process_manager)?;
    if !timer.correlation_id.is_empty() {
        validate_id("timer correlation id", timer.correlation_id)?;
    }
    let args = args![
        timer.id,
        timer.process_manager,
        timer.correlation_id,
        timer.fire_at,
        timer.payload,
        now,
    ];
    dispatch!(Conn, conn, |c, sql| {
        let writes = [
            (&sql.schedule_timer, ScheduleOutcome::Created),
            (&sql.rearm_timer, ScheduleOutcome::Updated),
        ];
        // Once-only: the first schedule wins, so no re-arming.
        for (statement, outcome) in &writes[..if once { 1 } else { 2 }] {
            let written = bind_all!(crate::prepared::query(statement), &args)
                .execute(&mut *c)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected();
            if written == 1 {
                return Ok(*outcome);
            }
        }
        let status: String = crate::prepared::query_scalar(&sql.timer_status)
            .bind(timer.id)
            .fetch_one(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        Ok(ScheduleOutcome::Unchanged(rows::timer_status(
            timer.id, &status,
        )?))
    })
}

/// Runs an id-only `UPDATE .. RETURNING` on `conn` and says why it did not
/// apply when it matched nothing.
async fn update(
    conn: Conn<'_>,
    op: &'static str,
    id: &str,
    statement: Statement,
    args: &[Arg<'_>],
) -> Result<TimerUpdate> {
    let (row, found) = returning_on(conn, op, id, statement, args).await?;
    Ok(match (row, found) {
        (Some(row), _) => TimerUpdate::Applied(row),
        (None, None) => TimerUpdate::Missing,
        (None, Some((TimerStatus::Resuming, lease_until))) => TimerUpdate::Guarded {
            lease_until: lease_until.unwrap_or(0),
        },
        (None, Some((other, _))) => TimerUpdate::NotApplicable(other),
    })
}

/// See [`Store::returning`].
async fn returning_on(
    conn: Conn<'_>,
    op: &'static str,
    id: &str,
    statement: Statement,
    args: &[Arg<'_>],
) -> Result<(Option<TimerRow>, Option<(TimerStatus, Option<i64>)>)> {
    dispatch!(Conn, conn, |c, sql| {
        // Run to its end (see `Store::fetch_optional`): outside a
        // transaction, SQLite commits the update there.
        let row = bind_all!(crate::prepared::query(statement(sql)), args)
            .fetch_all(&mut *c)
            .await
            .map_err(StoreError::query(op))?
            .into_iter()
            .next();
        if let Some(row) = row {
            return Ok((Some(TimerRow::from_row(&row)?), None));
        }
        let found: Option<(String, Option<i64>)> =
            crate::prepared::query_as(&sql.timer_status_and_lease)
                .bind(id)
                .fetch_optional(&mut *c)
                .await
                .map_err(StoreError::query(op))?;
        let found = match found {
            Some((status, lease_until)) => Some((rows::timer_status(id, &status)?, lease_until)),
            None => None,
        };
        Ok((None, found))
    })
}
