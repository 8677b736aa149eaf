//! Timer queries on SQLite: one writer, so a claim is a single `UPDATE` of
//! the earliest due row, and multi-statement writes run under `BEGIN IMMEDIATE`.

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{QueryBuilder, Sqlite};

use super::{
    diagnose, diagnose_claim, diagnose_resume, parse_status, record_from_row, NewTimer,
    ReasonMatch, ResumeClaimOutcome, ResumeEnd, ResumeUpdate, ScheduleOutcome, TimerListKind,
    TimerQuery, TimerRecord, TimerUpdate,
};
use crate::{now_ms, Result, SqliteStore, StoreError};

const COLUMNS: &str = "id, process_manager, correlation_id, fire_at, payload, status, attempts, \
     last_error, event_id, claimed_at, resume_lease_until, created_at, updated_at";

/// Inserts or re-arms a timer on `conn` (a transaction of the caller's or of
/// [`SqliteStore::schedule_timer`]).
pub(super) async fn schedule(
    conn: &mut SqliteConnection,
    timer: &NewTimer<'_>,
    once: bool,
) -> Result<ScheduleOutcome> {
    let now = now_ms();
    let inserted = sqlx::query(
        "INSERT INTO keiro_timers (id, process_manager, correlation_id, fire_at, payload, \
         status, attempts, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'scheduled', 0, ?6, ?6) ON CONFLICT (id) DO NOTHING",
    )
    .bind(timer.id)
    .bind(timer.process_manager)
    .bind(timer.correlation_id)
    .bind(timer.fire_at)
    .bind(timer.payload)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("schedule_timer"))?
    .rows_affected()
        == 1;
    if inserted {
        return Ok(ScheduleOutcome::Created);
    }
    if !once {
        let updated = sqlx::query(
            "UPDATE keiro_timers SET process_manager = ?2, correlation_id = ?3, fire_at = ?4, \
             payload = ?5, updated_at = ?6 WHERE id = ?1 AND status = 'scheduled'",
        )
        .bind(timer.id)
        .bind(timer.process_manager)
        .bind(timer.correlation_id)
        .bind(timer.fire_at)
        .bind(timer.payload)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(StoreError::query("schedule_timer"))?
        .rows_affected()
            == 1;
        if updated {
            return Ok(ScheduleOutcome::Updated);
        }
    }
    let status: String = sqlx::query_scalar("SELECT status FROM keiro_timers WHERE id = ?1")
        .bind(timer.id)
        .fetch_one(&mut *conn)
        .await
        .map_err(StoreError::query("schedule_timer"))?;
    Ok(ScheduleOutcome::Unchanged(parse_status(timer.id, &status)?))
}

/// Cancels a scheduled, firing or dead timer on `conn`.
pub(super) async fn cancel(conn: &mut SqliteConnection, id: &str) -> Result<TimerUpdate> {
    let row = sqlx::query(&format!(
        "UPDATE keiro_timers SET status = 'cancelled', updated_at = ?2 \
         WHERE id = ?1 AND status IN ('scheduled', 'firing', 'dead') RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(now_ms())
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query("cancel_timer"))?;
    match row {
        Some(row) => Ok(TimerUpdate::Applied(record_from_row(&row)?)),
        None => diagnose(id, status_of(&mut *conn, id, "cancel_timer").await?),
    }
}

async fn status_of(
    conn: &mut SqliteConnection,
    id: &str,
    op: &'static str,
) -> Result<Option<(String, Option<i64>)>> {
    sqlx::query_as("SELECT status, resume_lease_until FROM keiro_timers WHERE id = ?1")
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(StoreError::query(op))
}

impl SqliteStore {
    pub(crate) async fn schedule_timer(
        &self,
        timer: &NewTimer<'_>,
        once: bool,
    ) -> Result<ScheduleOutcome> {
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::query("schedule_timer"))?;
        let outcome = schedule(&mut tx, timer, once).await?;
        tx.commit()
            .await
            .map_err(StoreError::query("schedule_timer"))?;
        Ok(outcome)
    }

    pub(crate) async fn claim_due_timer(&self, now: i64) -> Result<Option<TimerRecord>> {
        // One statement: SQLite takes the write lock before it reads, so two
        // claimers never pick the same row.
        let row = sqlx::query(&format!(
            "UPDATE keiro_timers SET status = 'firing', attempts = attempts + 1, \
             claimed_at = ?1, updated_at = ?2 \
             WHERE id = (SELECT id FROM keiro_timers WHERE status = 'scheduled' AND fire_at <= ?1 \
             ORDER BY fire_at, id LIMIT 1) \
             RETURNING {COLUMNS}"
        ))
        .bind(now)
        .bind(now_ms())
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("claim_due_timer"))?;
        row.as_ref().map(record_from_row).transpose()
    }

    pub(crate) async fn next_timer_fire_at(&self) -> Result<Option<i64>> {
        sqlx::query_scalar("SELECT MIN(fire_at) FROM keiro_timers WHERE status = 'scheduled'")
            .fetch_one(self.pool())
            .await
            .map_err(StoreError::query("next_timer_fire_at"))
    }

    pub(crate) async fn get_timer(&self, id: &str) -> Result<Option<TimerRecord>> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM keiro_timers WHERE id = ?1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(StoreError::query("get_timer"))?;
        row.as_ref().map(record_from_row).transpose()
    }

    /// Runs an id-only `UPDATE .. RETURNING` and says why it did not apply
    /// when it matched nothing.
    async fn update<'q>(
        &self,
        op: &'static str,
        id: &str,
        query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<TimerUpdate> {
        let mut conn = self.pool().acquire().await.map_err(StoreError::query(op))?;
        let row: Option<SqliteRow> = query
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::query(op))?;
        match row {
            Some(row) => Ok(TimerUpdate::Applied(record_from_row(&row)?)),
            None => diagnose(id, status_of(&mut conn, id, op).await?),
        }
    }

    pub(crate) async fn mark_timer_fired(&self, id: &str, event_id: &str) -> Result<TimerUpdate> {
        let sql = format!(
            "UPDATE keiro_timers SET status = 'fired', event_id = ?2, updated_at = ?3 \
             WHERE id = ?1 AND status = 'firing' RETURNING {COLUMNS}"
        );
        let query = sqlx::query(&sql).bind(id).bind(event_id).bind(now_ms());
        self.update("mark_timer_fired", id, query).await
    }

    pub(crate) async fn count_due_timers(&self, now: i64) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM keiro_timers WHERE status = 'scheduled' AND fire_at <= ?1",
        )
        .bind(now)
        .fetch_one(self.pool())
        .await
        .map_err(StoreError::query("count_due_timers"))?;
        Ok(n as u64)
    }

    pub(crate) async fn count_stuck_timers(
        &self,
        claimed_by: i64,
        process_manager: Option<&str>,
    ) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM keiro_timers WHERE status = 'firing' AND claimed_at <= ?1 \
             AND (?2 IS NULL OR process_manager = ?2)",
        )
        .bind(claimed_by)
        .bind(process_manager)
        .fetch_one(self.pool())
        .await
        .map_err(StoreError::query("count_stuck_timers"))?;
        Ok(n as u64)
    }

    pub(crate) async fn requeue_stuck_timers(&self, claimed_by: i64) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE keiro_timers SET status = 'scheduled', updated_at = ?2 \
             WHERE status = 'firing' AND claimed_at <= ?1",
        )
        .bind(claimed_by)
        .bind(now_ms())
        .execute(self.pool())
        .await
        .map_err(StoreError::query("requeue_stuck_timers"))?;
        Ok(done.rows_affected())
    }

    pub(crate) async fn requeue_timer(&self, id: &str) -> Result<TimerUpdate> {
        let sql = format!(
            "UPDATE keiro_timers SET status = 'scheduled', \
             attempts = CASE WHEN status = 'dead' THEN 0 ELSE attempts END, updated_at = ?2 \
             WHERE id = ?1 AND status IN ('firing', 'dead') RETURNING {COLUMNS}"
        );
        let query = sqlx::query(&sql).bind(id).bind(now_ms());
        self.update("requeue_timer", id, query).await
    }

    pub(crate) async fn reschedule_timer(
        &self,
        id: &str,
        fire_at: i64,
        note: Option<&str>,
    ) -> Result<TimerUpdate> {
        let sql = format!(
            "UPDATE keiro_timers SET status = 'scheduled', fire_at = ?2, \
             last_error = COALESCE(?3, last_error), updated_at = ?4 \
             WHERE id = ?1 AND status IN ('firing', 'scheduled') RETURNING {COLUMNS}"
        );
        let query = sqlx::query(&sql)
            .bind(id)
            .bind(fire_at)
            .bind(note)
            .bind(now_ms());
        self.update("reschedule_timer", id, query).await
    }

    pub(crate) async fn cancel_timer(&self, id: &str) -> Result<TimerUpdate> {
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(StoreError::query("cancel_timer"))?;
        cancel(&mut conn, id).await
    }

    pub(crate) async fn dead_letter_timer(&self, id: &str, reason: &str) -> Result<TimerUpdate> {
        let sql = format!(
            "UPDATE keiro_timers SET status = 'dead', last_error = ?2, updated_at = ?3 \
             WHERE id = ?1 AND status IN ('scheduled', 'firing') RETURNING {COLUMNS}"
        );
        let query = sqlx::query(&sql).bind(id).bind(reason).bind(now_ms());
        self.update("dead_letter_timer", id, query).await
    }

    pub(crate) async fn find_timers(&self, query: &TimerQuery<'_>) -> Result<Vec<TimerRecord>> {
        let (status, key) = match query.kind {
            TimerListKind::Pending { .. } => ("scheduled", "fire_at"),
            TimerListKind::Stuck { .. } => ("firing", "claimed_at"),
            TimerListKind::Dead => ("dead", "updated_at"),
        };
        let mut sql: QueryBuilder<'_, Sqlite> = QueryBuilder::new(format!(
            "SELECT {COLUMNS} FROM keiro_timers WHERE status = '{status}'"
        ));
        match query.kind {
            TimerListKind::Pending { due_by: Some(due) } => {
                sql.push(" AND fire_at <= ").push_bind(due);
            }
            TimerListKind::Stuck { claimed_by } => {
                sql.push(" AND claimed_at <= ").push_bind(claimed_by);
            }
            _ => {}
        }
        if let Some(pm) = query.process_manager {
            sql.push(" AND process_manager = ").push_bind(pm);
        }
        match query.reason {
            Some(ReasonMatch::Exact(text)) => {
                sql.push(" AND last_error = ").push_bind(text);
            }
            Some(ReasonMatch::Contains(text)) => {
                sql.push(" AND instr(last_error, ")
                    .push_bind(text)
                    .push(") > 0");
            }
            None => {}
        }
        if let Some((after_key, after_id)) = query.after {
            sql.push(format!(" AND ({key}, id) > ("))
                .push_bind(after_key)
                .push(", ")
                .push_bind(after_id)
                .push(")");
        }
        sql.push(format!(" ORDER BY {key}, id LIMIT "))
            .push_bind(query.limit);
        let rows = sql
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::query("find_timers"))?;
        rows.iter().map(record_from_row).collect()
    }

    pub(crate) async fn claim_dead_timer(
        &self,
        id: &str,
        token: &str,
        lease_until: i64,
        now: i64,
    ) -> Result<ResumeClaimOutcome> {
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(StoreError::query("claim_dead_timer"))?;
        let row = sqlx::query(&format!(
            "UPDATE keiro_timers SET status = 'resuming', resume_token = ?2, \
             resume_lease_until = ?3, updated_at = ?5 \
             WHERE id = ?1 AND (status = 'dead' \
             OR (status = 'resuming' AND resume_lease_until <= ?4)) RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(token)
        .bind(lease_until)
        .bind(now)
        .bind(now_ms())
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::query("claim_dead_timer"))?;
        match row {
            Some(row) => Ok(ResumeClaimOutcome::Claimed(record_from_row(&row)?)),
            None => diagnose_claim(id, status_of(&mut conn, id, "claim_dead_timer").await?),
        }
    }

    pub(crate) async fn resume_transition(
        &self,
        id: &str,
        token: &str,
        now: i64,
        end: ResumeEnd<'_>,
    ) -> Result<ResumeUpdate> {
        const OP: &str = "timer_resume";
        let guard = "WHERE id = ?1 AND status = 'resuming' AND resume_token = ?2 \
                     AND resume_lease_until > ?3";
        let set = match end {
            ResumeEnd::Renew { .. } => "resume_lease_until = ?4",
            ResumeEnd::Complete { .. } => {
                "status = 'fired', event_id = ?4, resume_token = NULL, resume_lease_until = NULL"
            }
            ResumeEnd::Park { .. } => {
                "status = 'dead', last_error = COALESCE(?4, last_error), resume_token = NULL, \
                 resume_lease_until = NULL"
            }
            ResumeEnd::Cancel => {
                "status = 'cancelled', resume_token = NULL, resume_lease_until = NULL, \
                 last_error = COALESCE(?4, last_error)"
            }
        };
        let sql =
            format!("UPDATE keiro_timers SET {set}, updated_at = ?5 {guard} RETURNING {COLUMNS}");
        let query = sqlx::query(&sql).bind(id).bind(token).bind(now);
        let query = match end {
            ResumeEnd::Renew { lease_until } => query.bind(lease_until),
            ResumeEnd::Complete { event_id } => query.bind(event_id),
            ResumeEnd::Park { reason } => query.bind(reason),
            ResumeEnd::Cancel => query.bind(None::<&str>),
        };
        let mut conn = self.pool().acquire().await.map_err(StoreError::query(OP))?;
        let row = query
            .bind(now_ms())
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::query(OP))?;
        match row {
            Some(row) => Ok(ResumeUpdate::Applied(record_from_row(&row)?)),
            None => diagnose_resume(id, status_of(&mut conn, id, OP).await?),
        }
    }

    pub(crate) async fn recover_expired_timer_resumes(&self, now: i64) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE keiro_timers SET status = 'dead', resume_token = NULL, \
             resume_lease_until = NULL, updated_at = ?2 \
             WHERE status = 'resuming' AND resume_lease_until <= ?1",
        )
        .bind(now)
        .bind(now_ms())
        .execute(self.pool())
        .await
        .map_err(StoreError::query("recover_expired_timer_resumes"))?;
        Ok(done.rows_affected())
    }
}
