//! Messages sent to a workflow instance: one ordered queue per (instance,
//! topic), each message taken by exactly one journal step.
//!
//! A send checks the instance under its row lock, so it serializes with a
//! receiver that suspends ([`Store::suspend_for_message`]): either the
//! receiver sees the message, or the sender sees the suspended receiver and
//! makes it due. A receive journals the message as the receiving step's
//! result and marks it taken in one transaction, so a message is delivered
//! exactly once and a replay reads it back from the journal.

use crate::journal::{get_step_on, insert_step_on, journal_once};
use crate::rows::{self, StoreRow};
use crate::sql::Dialect;
use crate::{now_us, Conn, InstanceStatus, Result, StepRow, Store, StoreError, Suspend};

/// The statements of messages, events and streams, in one backend's dialect.
#[derive(Debug)]
pub(crate) struct TalkStatements {
    pub(crate) instance_status_locked: String,
    pub(crate) insert_message: String,
    pub(crate) wake_if_suspended: String,
    pub(crate) next_message: String,
    pub(crate) consume_message: String,
    pub(crate) message_waiting: String,
    pub(crate) count_waiting: String,
    pub(crate) upsert_event: String,
    pub(crate) get_event: String,
    pub(crate) next_position: String,
    pub(crate) stream_closed: String,
    pub(crate) insert_stream_entry: String,
    pub(crate) read_stream: String,
}

impl TalkStatements {
    /// Spells the statements in `d`'s dialect.
    pub(crate) fn new(d: &Dialect) -> TalkStatements {
        let table = |name: &str| format!("{}{name}", d.tables);
        let (w, m) = (table("workflows"), table("messages"));
        let (e, st) = (table("events"), table("streams"));
        TalkStatements {
            instance_status_locked: format!("SELECT status FROM {w} WHERE id = $1{}", d.lock_row),
            insert_message: format!(
                "INSERT INTO {m} (workflow_id, topic, payload, type_name, idempotency_key, \
                 sent_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id"
            ),
            wake_if_suspended: format!(
                "UPDATE {w} SET wake_at = $2, updated_at = $2 \
                 WHERE id = $1 AND status = 'suspended'"
            ),
            next_message: format!(
                "SELECT id, payload, type_name, sent_at FROM {m} \
                 WHERE workflow_id = $1 AND topic = $2 AND consumed_at IS NULL \
                 ORDER BY id LIMIT 1"
            ),
            consume_message: format!(
                "UPDATE {m} SET consumed_generation = $2, consumed_seq = $3, consumed_at = $4 \
                 WHERE id = $1 AND consumed_at IS NULL"
            ),
            message_waiting: format!(
                "SELECT 1 FROM {m} WHERE workflow_id = $1 AND topic = $2 \
                 AND consumed_at IS NULL LIMIT 1"
            ),
            count_waiting: format!(
                "SELECT COUNT(*) FROM {m} WHERE workflow_id = $1 AND topic = $2 \
                 AND consumed_at IS NULL"
            ),
            upsert_event: format!(
                "INSERT INTO {e} (workflow_id, key, value, type_name, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (workflow_id, key) DO UPDATE \
                 SET value = excluded.value, type_name = excluded.type_name, \
                 updated_at = excluded.updated_at"
            ),
            get_event: format!(
                "SELECT value, type_name, updated_at FROM {e} WHERE workflow_id = $1 AND key = $2"
            ),
            next_position: format!(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM {st} \
                 WHERE workflow_id = $1 AND key = $2"
            ),
            stream_closed: format!(
                "SELECT position FROM {st} WHERE workflow_id = $1 AND key = $2 \
                 AND value IS NULL LIMIT 1"
            ),
            insert_stream_entry: format!(
                "INSERT INTO {st} (workflow_id, key, position, value, type_name, written_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)"
            ),
            read_stream: format!(
                "SELECT position, value, type_name FROM {st} \
                 WHERE workflow_id = $1 AND key = $2 AND position >= $3 \
                 ORDER BY position LIMIT $4"
            ),
        }
    }
}

/// A message to send ([`Store::send_message`]).
#[derive(Debug, Clone, Copy)]
pub struct NewMessage<'a> {
    /// The receiving instance.
    pub workflow_id: &'a str,
    /// The queue within it.
    pub topic: &'a str,
    /// The JSON-encoded message.
    pub payload: &'a str,
    /// The sender's type, for a receiver's mismatch error.
    pub type_name: Option<&'a str>,
    /// A send with a key already used for this instance is a no-op.
    pub idempotency_key: Option<&'a str>,
    /// When sent from inside a workflow: the sending step, journaled in the
    /// same transaction so the send happens exactly once.
    pub journal: Option<&'a StepRow>,
}

/// What [`Store::send_message`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// Queued, with the message's id (its place in delivery order).
    Sent(i64),
    /// The idempotency key was used before: nothing new was queued.
    Duplicate,
    /// The sending step was journaled before (a replay): nothing was queued
    /// now; its recorded row is returned.
    Replayed(StepRow),
    /// No instance has this id.
    NotFound,
    /// The instance has ended with this status and takes no messages.
    Finished(InstanceStatus),
}

/// A queued message, as a receiver sees it before taking it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRow {
    /// Its id: messages of one queue are delivered in id order.
    pub id: i64,
    /// The JSON-encoded message.
    pub payload: String,
    /// The sender's type, when it said.
    pub type_name: Option<String>,
    /// When it was sent (µs since the Unix epoch).
    pub sent_at: i64,
}

/// The receiving step of [`Store::receive_message`].
#[derive(Debug, Clone, Copy)]
pub struct Receive<'a> {
    /// The receiving instance.
    pub workflow_id: &'a str,
    /// Its generation.
    pub generation: i64,
    /// The receiving step's sequence number.
    pub seq: i64,
    /// The step's name and kind, as journaled.
    pub name: &'a str,
    /// The step's kind, as journaled.
    pub kind: &'a str,
    /// The queue to take from.
    pub topic: &'a str,
    /// What the step journals when no message is waiting (a deadline that
    /// passed); `None`: nothing, the receiver keeps waiting.
    pub when_empty: Option<&'a str>,
}

/// What [`Store::receive_message`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// The step's journaled result: the message it took now (`{"Ok":…}`
    /// around its payload), what it took in an earlier run, or
    /// [`Receive::when_empty`].
    Journaled(StepRow),
    /// No message is waiting; nothing was journaled.
    Empty,
    /// The next message was refused by the receiver's check; it stays
    /// queued, untaken.
    Refused {
        /// The refused message.
        message: MessageRow,
        /// The check's reason.
        reason: String,
    },
}

impl Store {
    /// Queues a message for an unfinished instance and makes it due when it
    /// is suspended, in one transaction (journaling [`NewMessage::journal`]
    /// first when given).
    pub async fn send_message(&self, message: &NewMessage<'_>) -> Result<SendOutcome> {
        const OP: &str = "send_message";
        validate_message(message)?;
        let now = now_us();
        dispatch!(Store, self, |s| {
            let mut tx = s.begin(OP).await?;
            let outcome = send_message_on((&mut *tx).into(), message, now).await?;
            // Anything else wrote nothing that must stay: the transaction is
            // dropped.
            if matches!(outcome, SendOutcome::Sent(_) | SendOutcome::Duplicate) {
                tx.commit().await.map_err(StoreError::query(OP))?;
            }
            Ok(outcome)
        })
    }

    /// Takes the next message of `receive.topic` as the result of step
    /// `receive.seq`, journaling it and marking the message taken in one
    /// transaction; when that step is journaled already, returns its row
    /// (a replay takes nothing). `accept` checks a message before it is
    /// taken (that its payload decodes into the awaited type): a refused
    /// message stays queued.
    pub async fn receive_message(
        &self,
        receive: &Receive<'_>,
        accept: &(dyn Fn(&MessageRow) -> std::result::Result<(), String> + Sync),
    ) -> Result<Received> {
        const OP: &str = "receive_message";
        let now = now_us();
        dispatch!(Store, self, |s, sql| {
            let talk = &sql.talk;
            let mut tx = s.begin(OP).await?;
            let journaled = get_step_on(
                (&mut *tx).into(),
                OP,
                receive.workflow_id,
                receive.generation,
                receive.seq,
            )
            .await?;
            if let Some(row) = journaled {
                return Ok(Received::Journaled(row));
            }
            let next = sqlx::query(&talk.next_message)
                .bind(receive.workflow_id)
                .bind(receive.topic)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let message = next
                .as_ref()
                .map(|row| message_row(receive, row))
                .transpose()?;
            let result = match &message {
                Some(message) => {
                    if let Err(reason) = accept(message) {
                        return Ok(Received::Refused {
                            message: message.clone(),
                            reason,
                        });
                    }
                    let taken = sqlx::query(&talk.consume_message)
                        .bind(message.id)
                        .bind(receive.generation)
                        .bind(receive.seq)
                        .bind(now)
                        .execute(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?
                        .rows_affected();
                    if taken != 1 {
                        // A racing run of the same instance took it under
                        // this step id first; its journaled row stands.
                        drop(tx);
                        return self.receive_replayed(receive).await;
                    }
                    format!("{{\"Ok\":{}}}", message.payload)
                }
                None => match receive.when_empty {
                    Some(result) => result.to_owned(),
                    None => return Ok(Received::Empty),
                },
            };
            let row = StepRow {
                workflow_id: receive.workflow_id.to_owned(),
                generation: receive.generation,
                seq: receive.seq,
                name: receive.name.to_owned(),
                kind: receive.kind.to_owned(),
                result,
            };
            if !insert_step_on((&mut *tx).into(), OP, &row, now).await? {
                drop(tx);
                return self.receive_replayed(receive).await;
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Received::Journaled(row))
        })
    }

    /// The row a racing run journaled for `receive`'s step.
    async fn receive_replayed(&self, receive: &Receive<'_>) -> Result<Received> {
        let row = self
            .get_step(receive.workflow_id, receive.generation, receive.seq)
            .await?
            .ok_or_else(|| StoreError::Corrupt {
                what: format!(
                    "message of topic `{}` for workflow instance `{}` was taken by step {} \
                     (generation {}), whose journal row cannot be read",
                    receive.topic, receive.workflow_id, receive.seq, receive.generation
                ),
            })?;
        Ok(Received::Journaled(row))
    }

    /// Suspends like [`Store::suspend`], checking under the instance's row
    /// lock whether a message of `topic` is waiting: then the instance is due
    /// at once instead of at `suspend.wake_at`. A concurrent send is either
    /// seen here or sees the suspended instance and makes it due, so a
    /// receiver never sleeps past a message. Returns whether it applied (the
    /// lease was still held).
    pub async fn suspend_for_message(&self, suspend: &Suspend<'_>, topic: &str) -> Result<bool> {
        const OP: &str = "suspend_for_message";
        let now = now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            sqlx::query(&sql.talk.instance_status_locked)
                .bind(suspend.id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let waiting = sqlx::query(&sql.talk.message_waiting)
                .bind(suspend.id)
                .bind(topic)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .is_some();
            let applied = sqlx::query(&sql.suspend)
                .bind(suspend.id)
                .bind(suspend.generation)
                .bind(suspend.owner)
                .bind(if waiting { Some(now) } else { suspend.wake_at })
                .bind(now)
                .bind(suspend.awaiting)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
                == 1;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(applied)
        })
    }

    /// How many messages of `topic` wait, untaken, for instance `id`.
    pub async fn count_waiting_messages(&self, id: &str, topic: &str) -> Result<u64> {
        self.count(
            "count_waiting_messages",
            |sql| &sql.talk.count_waiting,
            &args![id, topic],
        )
        .await
    }
}

/// Checks `message` (ids and topic), for [`Store::send_message`] and the
/// outbox.
pub(crate) fn validate_message(message: &NewMessage<'_>) -> Result<()> {
    crate::validate_id("workflow id", message.workflow_id)?;
    crate::validate_id("message topic", message.topic)?;
    if let Some(key) = message.idempotency_key {
        crate::validate_id("idempotency key", key)?;
    }
    Ok(())
}

/// [`Store::send_message`] on `conn` (a transaction the caller commits when
/// it returns [`SendOutcome::Sent`] or [`SendOutcome::Duplicate`]).
pub(crate) async fn send_message_on(
    conn: Conn<'_>,
    message: &NewMessage<'_>,
    now: i64,
) -> Result<SendOutcome> {
    const OP: &str = "send_message";
    dispatch!(Conn, conn, |c, sql| {
        let talk = &sql.talk;
        let status: Option<String> = sqlx::query_scalar(&talk.instance_status_locked)
            .bind(message.workflow_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        let Some(status) = status else {
            return Ok(SendOutcome::NotFound);
        };
        let status = rows::instance_status(message.workflow_id, &status)?;
        if let Some(step) = message.journal {
            if let Some(first) = journal_once((&mut *c).into(), OP, step, now).await? {
                return Ok(SendOutcome::Replayed(first));
            }
        }
        if status.is_final() {
            return Ok(SendOutcome::Finished(status));
        }
        let id: Option<i64> = sqlx::query_scalar(&talk.insert_message)
            .bind(message.workflow_id)
            .bind(message.topic)
            .bind(message.payload)
            .bind(message.type_name)
            .bind(message.idempotency_key)
            .bind(now)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        let outcome = match id {
            Some(id) => {
                if status == InstanceStatus::Suspended {
                    sqlx::query(&talk.wake_if_suspended)
                        .bind(message.workflow_id)
                        .bind(now)
                        .execute(&mut *c)
                        .await
                        .map_err(StoreError::query(OP))?;
                }
                SendOutcome::Sent(id)
            }
            None => SendOutcome::Duplicate,
        };
        Ok(outcome)
    })
}

/// Reads a queued message for `receive`.
fn message_row(receive: &Receive<'_>, row: &impl StoreRow) -> Result<MessageRow> {
    let what = || {
        format!(
            "message of topic `{}` for workflow instance `{}`",
            receive.topic, receive.workflow_id
        )
    };
    Ok(MessageRow {
        id: row.int(what, "id")?,
        payload: row.text(what, "payload")?,
        type_name: row.maybe_text(what, "type_name")?,
        sent_at: row.int(what, "sent_at")?,
    })
}
