//! What a workflow publishes for readers outside it: events (the last value
//! set under a key) and streams (an append-only, ordered sequence per key).
//!
//! Each write is journaled as a step in the same transaction as the value, so
//! it happens exactly once; a replay finds the step journaled and writes
//! nothing.

use crate::journal::journal_once;
use crate::rows::StoreRow;
use crate::{AppendOutcome, Result, StepRow, Store, StoreError};

/// An event's value ([`Store::get_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// The JSON-encoded value.
    pub value: String,
    /// The writer's type, when it said.
    pub type_name: Option<String>,
    /// When it was last set (µs since the Unix epoch).
    pub updated_at: i64,
}

/// One entry of a stream ([`Store::read_stream`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEntry {
    /// Its position, from 0, without gaps.
    pub position: i64,
    /// The JSON-encoded value; `None` marks the end of the stream.
    pub value: Option<String>,
    /// The writer's type, when it said.
    pub type_name: Option<String>,
}

/// A value a workflow publishes: an event or a stream entry.
#[derive(Debug, Clone, Copy)]
pub struct Publish<'a> {
    /// The publishing step, journaled with the value.
    pub step: &'a StepRow,
    /// The event or stream key.
    pub key: &'a str,
    /// The JSON-encoded value; for a stream, `None` closes it.
    pub value: Option<&'a str>,
    /// The writer's type, for a reader's mismatch error.
    pub type_name: Option<&'a str>,
}

impl Store {
    /// Sets event `publish.key` of the step's instance to `publish.value`
    /// (the last value wins) and journals the step, in one transaction. When
    /// the step is journaled already (a replay) nothing is written and its
    /// row is returned.
    pub async fn set_event(&self, publish: &Publish<'_>) -> Result<AppendOutcome> {
        const OP: &str = "set_event";
        crate::validate_id("event key", publish.key)?;
        let value = publish.value.ok_or_else(|| StoreError::Corrupt {
            what: format!(
                "event `{}` of workflow instance `{}` set without a value",
                publish.key, publish.step.workflow_id
            ),
        })?;
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            if let Some(first) = journal_once((&mut *tx).into(), OP, publish.step, now).await? {
                return crate::query::rolled_back(tx, OP, AppendOutcome::Existing(first)).await;
            }
            crate::prepared::query(&sql.talk.upsert_event)
                .bind(&publish.step.workflow_id)
                .bind(publish.key)
                .bind(value)
                .bind(publish.type_name)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(AppendOutcome::Inserted)
        })
    }

    /// Reads event `key` of instance `id`; `None` until it is set.
    pub async fn get_event(&self, id: &str, key: &str) -> Result<Option<EventRow>> {
        const OP: &str = "get_event";
        dispatch!(Store, self, |s, sql| {
            let row = crate::prepared::query(&sql.talk.get_event)
                .bind(id)
                .bind(key)
                .fetch_optional(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            let what = || format!("event `{key}` of workflow instance `{id}`");
            row.map(|row| {
                Ok(EventRow {
                    value: row.text(what, "value")?,
                    type_name: row.maybe_text(what, "type_name")?,
                    updated_at: row.int(what, "updated_at")?,
                })
            })
            .transpose()
        })
    }

    /// Appends `publish.value` to stream `publish.key` of the step's
    /// instance (`None` closes the stream) and journals the step, in one
    /// transaction. A replay writes nothing and returns the journaled row;
    /// so does a write to a stream already closed (the close stands).
    pub async fn write_stream(&self, publish: &Publish<'_>) -> Result<AppendOutcome> {
        const OP: &str = "write_stream";
        crate::validate_id("stream key", publish.key)?;
        let now = self.now_us();
        let id = &publish.step.workflow_id;
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            if let Some(first) = journal_once((&mut *tx).into(), OP, publish.step, now).await? {
                return crate::query::rolled_back(tx, OP, AppendOutcome::Existing(first)).await;
            }
            let position: i64 = crate::prepared::query_scalar(&sql.talk.next_position)
                .bind(id)
                .bind(publish.key)
                .fetch_one(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let closed = position > 0
                && crate::prepared::query_scalar::<_, i64>(&sql.talk.stream_closed)
                    .bind(id)
                    .bind(publish.key)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?
                    .is_some();
            if !closed {
                crate::prepared::query(&sql.talk.insert_stream_entry)
                    .bind(id)
                    .bind(publish.key)
                    .bind(position)
                    .bind(publish.value)
                    .bind(publish.type_name)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(AppendOutcome::Inserted)
        })
    }

    /// Reads up to `limit` entries of stream `key` of instance `id`, from
    /// position `from` on, in order (the closing entry included).
    pub async fn read_stream(
        &self,
        id: &str,
        key: &str,
        from: i64,
        limit: i64,
    ) -> Result<Vec<StreamEntry>> {
        const OP: &str = "read_stream";
        dispatch!(Store, self, |s, sql| {
            let rows = crate::prepared::query(&sql.talk.read_stream)
                .bind(id)
                .bind(key)
                .bind(from)
                .bind(limit)
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            let what = || format!("stream `{key}` of workflow instance `{id}`");
            rows.iter()
                .map(|row| {
                    Ok(StreamEntry {
                        position: row.int(what, "position")?,
                        value: row.maybe_text(what, "value")?,
                        type_name: row.maybe_text(what, "type_name")?,
                    })
                })
                .collect()
        })
    }
}
