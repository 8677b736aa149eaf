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
/// read by name. A column that cannot be read is [`StoreError::Corrupt`],
/// naming the row (`what()`) and the column.
pub(crate) trait StoreRow {
    /// A text column.
    fn text(&self, what: impl Fn() -> String, column: &'static str) -> Result<String>;
    /// A text column that may be NULL.
    fn maybe_text(&self, what: impl Fn() -> String, column: &'static str)
        -> Result<Option<String>>;
    /// An integer column.
    fn int(&self, what: impl Fn() -> String, column: &'static str) -> Result<i64>;
    /// An integer column that may be NULL.
    fn maybe_int(&self, what: impl Fn() -> String, column: &'static str) -> Result<Option<i64>>;
    /// A boolean column.
    fn flag(&self, what: impl Fn() -> String, column: &'static str) -> Result<bool>;
}

impl<R> StoreRow for R
where
    R: Row,
    &'static str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, what: impl Fn() -> String, column: &'static str) -> Result<String> {
        read(self, what, column)
    }

    fn maybe_text(
        &self,
        what: impl Fn() -> String,
        column: &'static str,
    ) -> Result<Option<String>> {
        read(self, what, column)
    }

    fn int(&self, what: impl Fn() -> String, column: &'static str) -> Result<i64> {
        read(self, what, column)
    }

    fn maybe_int(&self, what: impl Fn() -> String, column: &'static str) -> Result<Option<i64>> {
        read(self, what, column)
    }

    fn flag(&self, what: impl Fn() -> String, column: &'static str) -> Result<bool> {
        read(self, what, column)
    }
}

fn read<'r, R, T>(row: &'r R, what: impl Fn() -> String, column: &'static str) -> Result<T>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(column).map_err(|e| StoreError::Corrupt {
        what: format!("{}: column `{column}` could not be read: {e}", what()),
    })
}

/// A value decoded from one row of either backend.
pub(crate) trait FromRow: Sized {
    /// Decodes `row`.
    fn from_row(row: &impl StoreRow) -> Result<Self>;
}

/// Decodes an [`InstanceRow`] (the columns of [`crate::sql::INSTANCE_COLUMNS`]).
impl FromRow for InstanceRow {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let id = row.text(|| "a workflow instance".into(), "id")?;
        let what = || format!("workflow instance `{id}`");
        let status = row.text(what, "status")?;
        Ok(InstanceRow {
            status: instance_status(&id, &status)?,
            name: row.text(what, "name")?,
            generation: row.int(what, "generation")?,
            input: row.text(what, "input")?,
            first_input: row.maybe_text(what, "first_input")?,
            signature: row.maybe_text(what, "signature")?,
            output: row.maybe_text(what, "output")?,
            error: row.maybe_text(what, "error")?,
            attempts: row.int(what, "attempts")?,
            lease_owner: row.maybe_text(what, "lease_owner")?,
            lease_expires_at: row.maybe_int(what, "lease_expires_at")?,
            wake_at: row.maybe_int(what, "wake_at")?,
            parent_id: row.maybe_text(what, "parent_id")?,
            parent_seq: row.maybe_int(what, "parent_seq")?,
            deadline: row.maybe_int(what, "deadline")?,
            traceparent: row.maybe_text(what, "traceparent")?,
            app_version: row.maybe_text(what, "app_version")?,
            skeleton_hash: row.maybe_text(what, "skeleton_hash")?,
            created_at: row.int(what, "created_at")?,
            updated_at: row.int(what, "updated_at")?,
            fresh: false,
            id,
        })
    }
}

/// An [`InstanceRow`] a claim returned, with its `fresh` column (see
/// [`crate::sql::claimed_columns`]).
pub(crate) struct Claimed(pub(crate) InstanceRow);

impl FromRow for Claimed {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let mut instance = InstanceRow::from_row(row)?;
        instance.fresh = row.flag(|| format!("workflow instance `{}`", instance.id), "fresh")?;
        Ok(Claimed(instance))
    }
}

/// Decodes a [`StepRow`] (the columns of [`crate::sql::STEP_COLUMNS`]).
impl FromRow for StepRow {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let (workflow_id, generation, seq) = step_key(row)?;
        let what =
            || format!("step {seq} of workflow instance `{workflow_id}` (generation {generation})");
        Ok(StepRow {
            name: row.text(what, "name")?,
            kind: row.text(what, "kind")?,
            result: row.text(what, "result")?,
            workflow_id,
            generation,
            seq,
        })
    }
}

/// Decodes a step id: `(workflow_id, generation, seq)`.
pub(crate) fn step_key(row: &impl StoreRow) -> Result<(String, i64, i64)> {
    let workflow_id = row.text(|| "a step".into(), "workflow_id")?;
    let of = || format!("a step of workflow instance `{workflow_id}`");
    let generation = row.int(of, "generation")?;
    let seq = row.int(|| format!("{} (generation {generation})", of()), "seq")?;
    Ok((workflow_id, generation, seq))
}

/// Decodes an [`ExecutorRow`].
impl FromRow for ExecutorRow {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let id = row.text(|| "an executor".into(), "id")?;
        let what = || format!("executor `{id}`");
        Ok(ExecutorRow {
            token: row.text(what, "token")?,
            host: row.text(what, "host")?,
            pid: row.int(what, "pid")?,
            heartbeat_at: row.int(what, "heartbeat_at")?,
            id,
        })
    }
}

/// Decodes a [`Blocked`] instance: `id`, `name`, its stored `signature` and
/// the `registered` one (NULL when its name is not registered).
impl FromRow for Blocked {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let id = row.text(|| "a blocked workflow instance".into(), "id")?;
        let what = || format!("workflow instance `{id}`");
        Ok(Blocked {
            name: row.text(what, "name")?,
            reason: BlockReason::of(
                row.maybe_text(what, "signature")?,
                row.maybe_text(what, "registered")?,
                row.maybe_text(what, "other_version")?,
            ),
            id,
        })
    }
}

/// Decodes a [`TimerRow`] (the columns of [`crate::sql::TIMER_COLUMNS`]).
impl FromRow for TimerRow {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let id = row.text(|| "a timer".into(), "id")?;
        let what = || format!("timer `{id}`");
        let status = row.text(what, "status")?;
        Ok(TimerRow {
            status: timer_status(&id, &status)?,
            process_manager: row.text(what, "process_manager")?,
            correlation_id: row.text(what, "correlation_id")?,
            fire_at: row.int(what, "fire_at")?,
            payload: row.text(what, "payload")?,
            attempts: row.int(what, "attempts")?,
            last_error: row.maybe_text(what, "last_error")?,
            event_id: row.maybe_text(what, "event_id")?,
            claimed_at: row.maybe_int(what, "claimed_at")?,
            resume_lease_until: row.maybe_int(what, "resume_lease_until")?,
            created_at: row.int(what, "created_at")?,
            updated_at: row.int(what, "updated_at")?,
            id,
        })
    }
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
