//! Row decoders, written once for both backends: generic over [`sqlx::Row`]
//! with the column types the store reads.
//!
//! A column that cannot be read is reported as [`StoreError::Corrupt`] naming
//! the row (instance, step, executor, timer) and the column.

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::{
    BlockReason, Blocked, ExecutorRow, InstanceRow, InstanceStatus, Result, StepRow, StoreError,
    TimerRow, TimerStatus,
};

/// A row of either backend whose text, integer and boolean columns can be
/// read by name.
pub(crate) trait StoreRow: Row {
    /// Reads column `column` of the row described by `what()`.
    fn read<'r, T>(&'r self, what: impl Fn() -> String, column: &'static str) -> Result<T>
    where
        T: Decode<'r, Self::Database> + Type<Self::Database>;
}

impl<R> StoreRow for R
where
    R: Row,
    &'static str: ColumnIndex<R>,
{
    fn read<'r, T>(&'r self, what: impl Fn() -> String, column: &'static str) -> Result<T>
    where
        T: Decode<'r, R::Database> + Type<R::Database>,
    {
        self.try_get(column).map_err(|e| StoreError::Corrupt {
            what: format!("{}: column `{column}` could not be read: {e}", what()),
        })
    }
}

/// Decodes an [`InstanceRow`] (the columns of [`crate::sql::INSTANCE_COLUMNS`]).
pub(crate) fn instance<'r, R>(row: &'r R) -> Result<InstanceRow>
where
    R: StoreRow,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.read(|| "a workflow instance".into(), "id")?;
    let what = || format!("workflow instance `{id}`");
    let status: String = row.read(what, "status")?;
    Ok(InstanceRow {
        status: instance_status(&id, &status)?,
        name: row.read(what, "name")?,
        generation: row.read(what, "generation")?,
        input: row.read(what, "input")?,
        first_input: row.read(what, "first_input")?,
        signature: row.read(what, "signature")?,
        output: row.read(what, "output")?,
        error: row.read(what, "error")?,
        attempts: row.read(what, "attempts")?,
        lease_owner: row.read(what, "lease_owner")?,
        lease_expires_at: row.read(what, "lease_expires_at")?,
        wake_at: row.read(what, "wake_at")?,
        parent_id: row.read(what, "parent_id")?,
        parent_seq: row.read(what, "parent_seq")?,
        created_at: row.read(what, "created_at")?,
        updated_at: row.read(what, "updated_at")?,
        id,
    })
}

/// Decodes a [`StepRow`] (the columns of [`crate::sql::STEP_COLUMNS`]).
pub(crate) fn step<'r, R>(row: &'r R) -> Result<StepRow>
where
    R: StoreRow,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let (workflow_id, generation, seq) = step_key(row)?;
    let what =
        || format!("step {seq} of workflow instance `{workflow_id}` (generation {generation})");
    Ok(StepRow {
        name: row.read(what, "name")?,
        kind: row.read(what, "kind")?,
        result: row.read(what, "result")?,
        workflow_id,
        generation,
        seq,
    })
}

/// Decodes a step id: `(workflow_id, generation, seq)`.
pub(crate) fn step_key<'r, R>(row: &'r R) -> Result<(String, i64, i64)>
where
    R: StoreRow,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let workflow_id: String = row.read(|| "a step".into(), "workflow_id")?;
    let of = || format!("a step of workflow instance `{workflow_id}`");
    let generation: i64 = row.read(of, "generation")?;
    let seq = row.read(|| format!("{} (generation {generation})", of()), "seq")?;
    Ok((workflow_id, generation, seq))
}

/// Decodes an [`ExecutorRow`].
pub(crate) fn executor<'r, R>(row: &'r R) -> Result<ExecutorRow>
where
    R: StoreRow,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.read(|| "an executor".into(), "id")?;
    let what = || format!("executor `{id}`");
    Ok(ExecutorRow {
        token: row.read(what, "token")?,
        host: row.read(what, "host")?,
        pid: row.read(what, "pid")?,
        heartbeat_at: row.read(what, "heartbeat_at")?,
        id,
    })
}

/// Decodes a [`Blocked`] instance: `id`, `name`, its stored `signature` and
/// the `registered` one (NULL when its name is not registered).
pub(crate) fn blocked<'r, R>(row: &'r R) -> Result<Blocked>
where
    R: StoreRow,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.read(|| "a blocked workflow instance".into(), "id")?;
    let what = || format!("workflow instance `{id}`");
    Ok(Blocked {
        name: row.read(what, "name")?,
        reason: BlockReason::of(row.read(what, "signature")?, row.read(what, "registered")?),
        id,
    })
}

/// Decodes a [`TimerRow`] (the columns of [`crate::sql::TIMER_COLUMNS`]).
pub(crate) fn timer<'r, R>(row: &'r R) -> Result<TimerRow>
where
    R: StoreRow,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.read(|| "a timer".into(), "id")?;
    let what = || format!("timer `{id}`");
    let status: String = row.read(what, "status")?;
    Ok(TimerRow {
        status: timer_status(&id, &status)?,
        process_manager: row.read(what, "process_manager")?,
        correlation_id: row.read(what, "correlation_id")?,
        fire_at: row.read(what, "fire_at")?,
        payload: row.read(what, "payload")?,
        attempts: row.read(what, "attempts")?,
        last_error: row.read(what, "last_error")?,
        event_id: row.read(what, "event_id")?,
        claimed_at: row.read(what, "claimed_at")?,
        resume_lease_until: row.read(what, "resume_lease_until")?,
        created_at: row.read(what, "created_at")?,
        updated_at: row.read(what, "updated_at")?,
        id,
    })
}

/// Parses instance `id`'s `status` column.
pub(crate) fn instance_status(id: &str, text: &str) -> Result<InstanceStatus> {
    InstanceStatus::parse(text).ok_or_else(|| StoreError::Corrupt {
        what: format!("workflow instance `{id}` has unknown status `{text}`"),
    })
}

/// Parses timer `id`'s `status` column.
pub(crate) fn timer_status(id: &str, text: &str) -> Result<TimerStatus> {
    TimerStatus::parse(text).ok_or_else(|| StoreError::Corrupt {
        what: format!("timer `{id}` has unknown status `{text}`"),
    })
}
