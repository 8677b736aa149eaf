//! Messages on PostgreSQL: a whole batch of sends, and of receivers' takes,
//! in one statement each, from arrays with `UNNEST`, instead of one round
//! trip per message.

use std::collections::HashSet;

use super::PostgresStore;
use crate::journal::get_step_on;
use crate::{rows, NewMessage, Result, SendOutcome, StoreError, Take, Taken};

/// Queues a batch of messages given as parallel arrays: locks their
/// instances in id order, queues each message whose instance is unfinished
/// (numbered in batch order), makes suspended receivers due (by the status
/// read under the lock, not the row's snapshot) and notifies their
/// processes at commit. One row per message, in batch order: its instance's
/// status (NULL: no such instance) and its id (NULL: not queued).
const SEND_MANY: &str = "WITH input AS (SELECT * FROM UNNEST($1::text[], $2::text[], \
         $3::text[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY \
         AS i(workflow_id, topic, payload, type_name, idempotency_key, notify, ord)), \
     w AS (SELECT id, status FROM keiro.workflows \
         WHERE id IN (SELECT workflow_id FROM input) ORDER BY id FOR UPDATE), \
     numbered AS (SELECT i.ord, i.workflow_id, i.topic, i.payload, i.type_name, \
         i.idempotency_key, i.notify, \
         nextval(pg_get_serial_sequence('keiro.messages', 'id')) AS mid \
         FROM input i JOIN w ON w.id = i.workflow_id \
         WHERE w.status IN ('pending', 'running', 'suspended')), \
     ins AS (INSERT INTO keiro.messages (id, workflow_id, topic, payload, type_name, \
         idempotency_key, sent_at) OVERRIDING SYSTEM VALUE \
         SELECT mid, workflow_id, topic, payload, type_name, idempotency_key, $7 \
         FROM numbered ORDER BY mid \
         ON CONFLICT DO NOTHING RETURNING id, workflow_id), \
     wake AS (UPDATE keiro.workflows SET wake_at = $7, updated_at = $7 \
         WHERE id IN (SELECT workflow_id FROM ins) \
         AND id IN (SELECT id FROM w WHERE status = 'suspended')), \
     notified AS (SELECT pg_notify('keiro_wake', n.notify) FROM numbered n \
         JOIN ins ON ins.id = n.mid) \
     SELECT w.status, ins.id, (SELECT COUNT(*) FROM notified) AS notified \
     FROM input i LEFT JOIN w ON w.id = i.workflow_id \
     LEFT JOIN numbered n ON n.ord = i.ord LEFT JOIN ins ON ins.id = n.mid \
     ORDER BY i.ord";

/// Marks each message taken (unless it was, or its step is journaled) and
/// journals its step, for a batch given as parallel arrays; returns the
/// 1-based positions of the takes that took their message. A step journaled
/// by a racing run after the check fails the statement (no `ON CONFLICT`),
/// so a message is never marked taken without its step.
const TAKE_MANY: &str = "WITH input AS (SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], \
         $4::text[], $5::text[], $6::text[], $7::int8[]) WITH ORDINALITY \
         AS i(workflow_id, generation, seq, name, kind, result, message_id, ord)), \
     taken AS (UPDATE keiro.messages m SET consumed_generation = i.generation, \
         consumed_seq = i.seq, consumed_at = $8 \
         FROM input i \
         WHERE m.id = i.message_id AND m.consumed_at IS NULL \
         AND NOT EXISTS (SELECT 1 FROM keiro.steps s WHERE s.workflow_id = i.workflow_id \
             AND s.generation = i.generation AND s.seq = i.seq) \
         RETURNING i.ord), \
     journaled AS (INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, \
         created_at) \
         SELECT i.workflow_id, i.generation, i.seq, i.name, i.kind, i.result, $8 \
         FROM input i JOIN taken t ON t.ord = i.ord ORDER BY i.ord) \
     SELECT ord FROM taken";

impl PostgresStore {
    /// [`crate::Store::send_messages`] for messages sent from outside any
    /// workflow (no journal step), in one statement.
    pub(crate) async fn send_messages_at_once(
        &self,
        messages: &[NewMessage<'_>],
    ) -> Result<Vec<SendOutcome>> {
        const OP: &str = "send_message";
        let now = self.clock.now_us();
        let text = |f: fn(&NewMessage<'_>) -> Option<String>| {
            messages.iter().map(f).collect::<Vec<Option<String>>>()
        };
        let found: Vec<(Option<String>, Option<i64>, i64)> = crate::prepared::query_as(SEND_MANY)
            .bind(text(|m| Some(m.workflow_id.to_owned())))
            .bind(text(|m| Some(m.topic.to_owned())))
            .bind(text(|m| Some(m.payload.to_owned())))
            .bind(text(|m| m.type_name.map(str::to_owned)))
            .bind(text(|m| m.idempotency_key.map(str::to_owned)))
            .bind(text(|m| {
                Some(crate::wake_payload(m.workflow_id).into_owned())
            }))
            .bind(now)
            .fetch_all(self.exec())
            .await
            .map_err(StoreError::query(OP))?;
        if found.len() != messages.len() {
            return Err(StoreError::Corrupt {
                what: format!(
                    "a batch of {} messages was answered with {} rows",
                    messages.len(),
                    found.len()
                ),
            });
        }
        messages
            .iter()
            .zip(found)
            .map(|(message, (status, id, _))| {
                let Some(status) = status else {
                    return Ok(SendOutcome::NotFound);
                };
                let status = rows::instance_status(message.workflow_id, &status)?;
                Ok(match id {
                    Some(id) => SendOutcome::Sent(id),
                    None if status.is_final() => SendOutcome::Finished(status),
                    None => SendOutcome::Duplicate,
                })
            })
            .collect()
    }

    /// [`crate::Store::take_messages`] in one statement (plus a read for
    /// each take that did not take its message).
    pub(crate) async fn take_messages(&self, takes: &[Take]) -> Result<Vec<Taken>> {
        const OP: &str = "take_messages";
        let now = self.clock.now_us();
        let mut tx = self.begin(OP).await?;
        let column = |f: fn(&Take) -> String| takes.iter().map(f).collect::<Vec<_>>();
        let number = |f: fn(&Take) -> i64| takes.iter().map(f).collect::<Vec<_>>();
        let took: Vec<i64> = crate::prepared::query_scalar(TAKE_MANY)
            .bind(column(|t| t.step.workflow_id.clone()))
            .bind(number(|t| t.step.generation))
            .bind(number(|t| t.step.seq))
            .bind(column(|t| t.step.name.clone()))
            .bind(column(|t| t.step.kind.clone()))
            .bind(column(|t| t.step.result.clone()))
            .bind(number(|t| t.message_id))
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?;
        let took: HashSet<i64> = took.into_iter().collect();
        let mut taken = Vec::with_capacity(takes.len());
        for (position, take) in (1..).zip(takes) {
            if took.contains(&position) {
                taken.push(Taken::Journaled(take.step.clone()));
                continue;
            }
            let step = &take.step;
            let journaled = get_step_on(
                (&mut *tx).into(),
                OP,
                &step.workflow_id,
                step.generation,
                step.seq,
            )
            .await?;
            taken.push(journaled.map_or(Taken::Gone, Taken::Journaled));
        }
        tx.commit().await.map_err(StoreError::query(OP))?;
        Ok(taken)
    }
}
