//! Messages sent to a workflow instance: one ordered queue per (instance,
//! topic), each message taken by exactly one journal step.
//!
//! A send checks the instance under its row lock, so it serializes with a
//! receiver that suspends ([`Store::suspend_for_message`]): either the
//! receiver sees the message, or the sender sees the suspended receiver and
//! makes it due. A receive journals the message as the receiving step's
//! result and marks it taken in one transaction, so a message is delivered
//! exactly once and a replay reads it back from the journal.

use crate::journal::{get_step_on, insert_step_on, journal_once, unreadable_step};
use crate::rows::{self, StoreRow};
use crate::sql::Dialect;
use crate::{AppendOutcome, Conn, InstanceStatus, Result, StepRow, Store, StoreError, Suspend};

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
    pub(crate) waiting_messages: String,
    pub(crate) upsert_event: String,
    pub(crate) get_event: String,
    pub(crate) next_position: String,
    pub(crate) stream_closed: String,
    pub(crate) insert_stream_entry: String,
    pub(crate) read_stream: String,
    /// With modifying CTEs: a send without a journal step in one statement
    /// (locks the instance, queues the message if it is unfinished, makes
    /// it due if suspended; returns its status and the message id).
    pub(crate) send_one: Option<String>,
    /// Whether [`TalkStatements::send_one`] notifies the receiver's process.
    pub(crate) notifies: bool,
}

impl TalkStatements {
    /// Spells the statements in `d`'s dialect.
    pub(crate) fn new(d: &Dialect) -> TalkStatements {
        let table = |name: &str| format!("{}{name}", d.tables);
        let (w, m) = (table("workflows"), table("messages"));
        let (e, st) = (table("events"), table("streams"));
        // The wake tests the status `w` read under the row lock (the latest
        // version), not the row's status column, which the statement sees
        // as of its snapshot: a receiver that suspended while this send
        // waited for the lock is then still woken.
        // The receiver's process is notified in the same statement (PostgreSQL
        // delivers it at commit): no round trip of its own per message.
        let notify = match d.wake_channel {
            Some(channel) => format!("SELECT pg_notify('{channel}', $7) FROM ins"),
            None => "SELECT 1 FROM ins WHERE false".to_owned(),
        };
        let send_one = d.modifying_ctes.then(|| {
            format!(
                "WITH w AS (SELECT status FROM {w} WHERE id = $1 FOR UPDATE), \
                 ins AS (INSERT INTO {m} (workflow_id, topic, payload, type_name, \
                     idempotency_key, sent_at) \
                     SELECT $1, $2, $3, $4, $5, $6 FROM w \
                     WHERE w.status IN ('pending', 'running', 'suspended') \
                     ON CONFLICT DO NOTHING RETURNING id), \
                 wake AS (UPDATE {w} SET wake_at = $6, updated_at = $6 \
                     WHERE id = $1 AND (SELECT status FROM w) = 'suspended' \
                     AND EXISTS (SELECT 1 FROM ins)), \
                 notified AS ({notify}) \
                 SELECT (SELECT status FROM w) AS status, (SELECT id FROM ins) AS id, \
                     (SELECT COUNT(*) FROM notified) AS notified"
            )
        });
        TalkStatements {
            notifies: d.wake_channel.is_some(),
            send_one,
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
            waiting_messages: format!(
                "SELECT id, topic, payload, type_name, sent_at FROM {m} \
                 WHERE workflow_id = $1 AND consumed_at IS NULL ORDER BY id LIMIT $2"
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

/// A message queued for an instance and not yet taken
/// ([`Store::waiting_messages`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingMessage {
    /// The queue it waits in.
    pub topic: String,
    /// The message.
    pub message: MessageRow,
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

impl Receive<'_> {
    /// The receiving step's journal row with `result`.
    fn step_row(&self, result: String) -> StepRow {
        StepRow {
            workflow_id: self.workflow_id.to_owned(),
            generation: self.generation,
            seq: self.seq,
            name: self.name.to_owned(),
            kind: self.kind.to_owned(),
            result,
        }
    }
}

/// A message to take as a receiving step's result ([`Store::take_messages`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    /// The receiving step's row: its result is `{"Ok":<payload>}`.
    pub step: StepRow,
    /// The message taken.
    pub message_id: i64,
}

impl Take {
    /// Taking `message` as `receive`'s step.
    pub fn new(receive: &Receive<'_>, message: &MessageRow) -> Take {
        Take {
            step: receive.step_row(format!("{{\"Ok\":{}}}", message.payload)),
            message_id: message.id,
        }
    }
}

/// What [`Store::take_messages`] did with one take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The step's journaled row: the message taken now, or what the step
    /// journaled before (then nothing was taken).
    Journaled(StepRow),
    /// The message was taken meanwhile by another step; nothing was written.
    Gone,
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
    /// The PostgreSQL store, when this is one: for the batch statements only
    /// it has.
    #[cfg(feature = "postgres")]
    fn as_postgres(&self) -> Option<&crate::PostgresStore> {
        match self {
            Store::Postgres(pg) => Some(pg),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Queues a message for an unfinished instance and makes it due when it
    /// is suspended, in one transaction (journaling [`NewMessage::journal`]
    /// first when given).
    pub async fn send_message(&self, message: &NewMessage<'_>) -> Result<SendOutcome> {
        let mut outcomes = self.send_messages(std::slice::from_ref(message)).await?;
        outcomes.pop().ok_or_else(|| StoreError::Corrupt {
            what: "a send of one message returned no outcome".into(),
        })
    }

    /// Like [`Store::send_message`] for several messages, in one
    /// transaction; one outcome per message, in order. A refused message
    /// (missing or ended instance) writes nothing and does not fail the
    /// others. Instances are locked in id order, so concurrent batches never
    /// deadlock on each other.
    pub async fn send_messages(&self, messages: &[NewMessage<'_>]) -> Result<Vec<SendOutcome>> {
        const OP: &str = "send_message";
        for message in messages {
            validate_message(message)?;
        }
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.as_postgres() {
            // One statement (and one commit) for the whole batch, unless a
            // workflow's send, journaled with its message, is among them.
            if messages.iter().all(|m| m.journal.is_none()) {
                return pg.send_messages_at_once(messages).await;
            }
        }
        let mut order: Vec<usize> = (0..messages.len()).collect();
        order.sort_by_key(|&i| messages[i].workflow_id);
        let now = self.now_us();
        dispatch!(Store, self, |s| {
            let mut tx = s.begin(OP).await?;
            let mut outcomes: Vec<Option<SendOutcome>> = vec![None; messages.len()];
            for &i in &order {
                outcomes[i] = Some(send_message_on((&mut *tx).into(), &messages[i], now).await?);
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(outcomes.into_iter().flatten().collect())
        })
    }

    /// Takes the next message of `receive.topic` as the result of step
    /// `receive.seq`; when that step is journaled already, returns its row
    /// (a replay takes nothing). `accept` checks a message before it is
    /// taken (that its payload decodes into the awaited type): a refused
    /// message stays queued. With no message waiting it journals
    /// [`Receive::when_empty`], if given.
    ///
    /// The message is read first, then taken by [`Store::take_messages`]
    /// (journaling it as the step's result and marking it taken in one
    /// transaction, only if it is still untaken), so many receivers' takes
    /// can share one commit.
    pub async fn receive_message(
        &self,
        receive: &Receive<'_>,
        accept: &(dyn Fn(&MessageRow) -> std::result::Result<(), String> + Sync),
    ) -> Result<Received> {
        loop {
            if let Some(row) = self
                .get_step(receive.workflow_id, receive.generation, receive.seq)
                .await?
            {
                return Ok(Received::Journaled(row));
            }
            let Some(message) = self
                .next_message(receive.workflow_id, receive.topic)
                .await?
            else {
                let Some(result) = receive.when_empty else {
                    return Ok(Received::Empty);
                };
                let row = receive.step_row(result.to_owned());
                return Ok(Received::Journaled(
                    match self.append_steps(std::slice::from_ref(&row)).await?.pop() {
                        Some(AppendOutcome::Existing(first)) => first,
                        _ => row,
                    },
                ));
            };
            if let Err(reason) = accept(&message) {
                return Ok(Received::Refused { message, reason });
            }
            let take = Take::new(receive, &message);
            match self.take_messages(std::slice::from_ref(&take)).await?.pop() {
                Some(Taken::Journaled(row)) => return Ok(Received::Journaled(row)),
                // Taken by a racing run under another step: look again.
                Some(Taken::Gone) | None => continue,
            }
        }
    }

    /// The next untaken message of `topic` for instance `id`, if any (a
    /// read; taking it is [`Store::take_messages`]).
    pub async fn next_message(&self, id: &str, topic: &str) -> Result<Option<MessageRow>> {
        const OP: &str = "next_message";
        dispatch!(Store, self, |s, sql| {
            let row = crate::prepared::query(&sql.talk.next_message)
                .bind(id)
                .bind(topic)
                .fetch_optional(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref()
                .map(|row| message_row(id, topic, row))
                .transpose()
        })
    }

    /// Takes each message as its receiving step's result, in one
    /// transaction: journals the step (`{"Ok":<payload>}`) and marks the
    /// message taken, only while it is untaken. A step journaled already
    /// keeps its row ([`Taken::Journaled`] with it, nothing taken); a message
    /// taken meanwhile by another step is [`Taken::Gone`].
    pub async fn take_messages(&self, takes: &[Take]) -> Result<Vec<Taken>> {
        const OP: &str = "take_messages";
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.as_postgres() {
            return pg.take_messages(takes).await;
        }
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let mut taken = Vec::with_capacity(takes.len());
            for take in takes {
                let step = &take.step;
                let journaled = get_step_on(
                    (&mut *tx).into(),
                    OP,
                    &step.workflow_id,
                    step.generation,
                    step.seq,
                )
                .await?;
                if let Some(row) = journaled {
                    taken.push(Taken::Journaled(row));
                    continue;
                }
                let marked = crate::prepared::query(&sql.talk.consume_message)
                    .bind(take.message_id)
                    .bind(step.generation)
                    .bind(step.seq)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?
                    .rows_affected();
                if marked != 1 {
                    taken.push(Taken::Gone);
                    continue;
                }
                if !insert_step_on((&mut *tx).into(), OP, step, now).await? {
                    return Err(unreadable_step(step));
                }
                taken.push(Taken::Journaled(step.clone()));
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(taken)
        })
    }

    /// Suspends like [`Store::suspend`], checking under the instance's row
    /// lock whether a message of `topic` is waiting: then the instance is due
    /// at once instead of at `suspend.wake_at`. A concurrent send is either
    /// seen here or sees the suspended instance and makes it due, so a
    /// receiver never sleeps past a message. Returns whether it applied (the
    /// lease was still held).
    pub async fn suspend_for_message(&self, suspend: &Suspend<'_>, topic: &str) -> Result<bool> {
        // One wake condition of the general case.
        self.suspend_for_any(suspend, &[], &[topic.to_owned()])
            .await
    }

    /// Whether [`Store::send_message`] (and the writer's batched sends)
    /// notify the receiver's process themselves for a message sent without
    /// a journal step: PostgreSQL does, in the statement that queues it, so
    /// the caller need not call [`Store::wake_workers`] after it.
    pub fn notifies_sends(&self) -> bool {
        dispatch!(Store, self, |_s, sql| sql.talk.send_one.is_some()
            && sql.talk.notifies)
    }

    /// The first `limit` messages of any topic waiting, untaken, for
    /// instance `id`, in the order they were sent.
    pub async fn waiting_messages(&self, id: &str, limit: i64) -> Result<Vec<WaitingMessage>> {
        const OP: &str = "waiting_messages";
        dispatch!(Store, self, |s, sql| {
            let rows = crate::prepared::query(&sql.talk.waiting_messages)
                .bind(id)
                .bind(limit)
                .fetch_all(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            rows.iter()
                .map(|row| {
                    let topic = row.text(
                        || format!("waiting message for workflow instance `{id}`"),
                        "topic",
                    )?;
                    let message = message_row(id, &topic, row)?;
                    Ok(WaitingMessage { topic, message })
                })
                .collect()
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

/// Sends `message` on `conn` (inside a transaction: the instance's row is
/// locked until it ends). A refused message (missing or ended instance)
/// writes nothing, so it may share a transaction with others; a replay of a
/// send that went through before reads as [`SendOutcome::Replayed`].
pub(crate) async fn send_message_on(
    conn: Conn<'_>,
    message: &NewMessage<'_>,
    now: i64,
) -> Result<SendOutcome> {
    const OP: &str = "send_message";
    dispatch!(Conn, conn, |c, sql| {
        let talk = &sql.talk;
        if let (Some(send_one), None) = (&talk.send_one, message.journal) {
            let (status, id, _notified): (Option<String>, Option<i64>, i64) =
                crate::prepared::query_as(send_one)
                    .bind(message.workflow_id)
                    .bind(message.topic)
                    .bind(message.payload)
                    .bind(message.type_name)
                    .bind(message.idempotency_key)
                    .bind(now)
                    .bind(crate::wake_payload(message.workflow_id).as_ref())
                    .fetch_one(&mut *c)
                    .await
                    .map_err(StoreError::query(OP))?;
            let Some(status) = status else {
                return Ok(SendOutcome::NotFound);
            };
            let status = rows::instance_status(message.workflow_id, &status)?;
            return Ok(match id {
                Some(id) => SendOutcome::Sent(id),
                None if status.is_final() => SendOutcome::Finished(status),
                None => SendOutcome::Duplicate,
            });
        }
        let status: Option<String> = crate::prepared::query_scalar(&talk.instance_status_locked)
            .bind(message.workflow_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        let status = status
            .map(|status| rows::instance_status(message.workflow_id, &status))
            .transpose()?;
        let refusal = match status {
            None => Some(SendOutcome::NotFound),
            Some(status) if status.is_final() => Some(SendOutcome::Finished(status)),
            Some(_) => None,
        };
        if let Some(refusal) = refusal {
            let Some(step) = message.journal else {
                return Ok(refusal);
            };
            let journaled = get_step_on(
                (&mut *c).into(),
                OP,
                &step.workflow_id,
                step.generation,
                step.seq,
            )
            .await?;
            return Ok(journaled.map_or(refusal, SendOutcome::Replayed));
        }
        if let Some(step) = message.journal {
            if let Some(first) = journal_once((&mut *c).into(), OP, step, now).await? {
                return Ok(SendOutcome::Replayed(first));
            }
        }
        let id: Option<i64> = crate::prepared::query_scalar(&talk.insert_message)
            .bind(message.workflow_id)
            .bind(message.topic)
            .bind(message.payload)
            .bind(message.type_name)
            .bind(message.idempotency_key)
            .bind(now)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        let Some(id) = id else {
            return Ok(SendOutcome::Duplicate);
        };
        if status == Some(InstanceStatus::Suspended) {
            crate::prepared::query(&talk.wake_if_suspended)
                .bind(message.workflow_id)
                .bind(now)
                .execute(&mut *c)
                .await
                .map_err(StoreError::query(OP))?;
        }
        Ok(SendOutcome::Sent(id))
    })
}

/// Reads a queued message of `topic` for instance `id`.
fn message_row(id: &str, topic: &str, row: &impl StoreRow) -> Result<MessageRow> {
    let what = || format!("message of topic `{topic}` for workflow instance `{id}`");
    Ok(MessageRow {
        id: row.int(what, "id")?,
        payload: row.text(what, "payload")?,
        type_name: row.maybe_text(what, "type_name")?,
        sent_at: row.int(what, "sent_at")?,
    })
}
