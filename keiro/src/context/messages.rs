//! Messages: [`send`] queues a value on a topic of a workflow instance, from
//! anywhere; [`recv`] inside that workflow takes the next one, waiting as long
//! as it takes (suspended, costing only a row, past the runtime's
//! `suspend_after`).
//!
//! Messages of one (instance, topic) are delivered in the order sent, each to
//! exactly one `recv`: taking a message and journaling it as the receiving
//! step's result is one transaction, so a replay reads it back instead.

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keiro_store::{
    AppendOutcome, MessageRequest, MessageRow, NewMessage, Outcome, Receive, SendOutcome, StepRow,
    Take, Taken,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{claim_seq, claim_seqs, halt, record, Halt, StepKind, WorkflowContext};
use crate::error::TypeMismatch;
use crate::registry::BoxFuture;
use crate::time::to_us;
use crate::{Error, Keiro, Result};

/// What a receive that passed its deadline journals.
const TIMED_OUT: &str = "{\"Err\":\"timed out\"}";

/// How often a workflow waiting in memory for a message looks at the store
/// when nothing wakes it sooner: at first, doubling while nothing comes, up
/// to [`RECV_POLL_MAX`]. A send wakes the receiver at once (in this process,
/// and through `NOTIFY` on PostgreSQL), so polling only covers a lost
/// notification, or a send from another process on SQLite; backing off
/// keeps a hundred idle receivers from querying the store thousands of
/// times a second.
const RECV_POLL: Duration = Duration::from_millis(20);
const RECV_POLL_MAX: Duration = Duration::from_millis(200);

/// Takes the next message on `topic` for the current workflow, as a `T`.
/// Awaiting it waits as long as it takes: in memory for the runtime's
/// `suspend_after`, then suspended until a message arrives. A message that
/// does not decode into `T` is refused with [`Error::MessageType`] and left
/// queued. Outside a workflow, awaiting it is [`Error::NotInWorkflow`].
///
/// ```no_run
/// #[keiro::workflow]
/// async fn order(id: String) -> Result<String, String> {
///     let approved: bool = keiro::recv("approval").await.map_err(|e| e.to_string())?;
///     // Or give up after a day; the deadline survives crashes and replays.
///     let note: Option<String> = keiro::recv("note")
///         .timeout(std::time::Duration::from_secs(86_400))
///         .await
///         .map_err(|e| e.to_string())?;
///     Ok(format!("{id}: {approved} {note:?}"))
/// }
/// ```
pub fn recv<T>(topic: impl Into<String>) -> Recv<T>
where
    T: DeserializeOwned + Send + 'static,
{
    // Two ids: the message taken, and the deadline of a `.timeout`.
    Recv {
        topic: topic.into(),
        slot: claim_seqs(2),
        _value: PhantomData,
    }
}

/// The next message on a topic ([`recv`]); `.await` it, or bound the wait
/// with [`Recv::timeout`].
#[must_use = "a receive does nothing until it is awaited"]
pub struct Recv<T> {
    topic: String,
    slot: Option<(Arc<WorkflowContext>, i64)>,
    _value: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Recv<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recv").field("topic", &self.topic).finish()
    }
}

impl<T: DeserializeOwned + Send + 'static> Recv<T> {
    /// Waits at most `duration` (from now, journaled when the wait first
    /// runs: a crash or replay keeps the original deadline); `None` once it
    /// has passed with no message.
    pub fn timeout(self, duration: Duration) -> RecvTimeout<T> {
        RecvTimeout {
            deadline: super::clock_now() + duration,
            recv: self,
        }
    }
}

/// A [`Recv`] with a deadline; yields `Ok(None)` when it passes first.
#[must_use = "a receive does nothing until it is awaited"]
#[derive(Debug)]
pub struct RecvTimeout<T> {
    recv: Recv<T>,
    deadline: SystemTime,
}

impl<T: DeserializeOwned + Send + 'static> super::Durable for Recv<T> {}
impl<T: DeserializeOwned + Send + 'static> super::Durable for RecvTimeout<T> {}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for Recv<T> {
    type Output = Result<T>;
    type IntoFuture = BoxFuture<'static, Result<T>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let taken = receive::<T>(self.slot, &self.topic, None).await?;
            taken.ok_or_else(|| Error::Internal("a receive without deadline timed out".into()))
        })
    }
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for RecvTimeout<T> {
    type Output = Result<Option<T>>;
    type IntoFuture = BoxFuture<'static, Result<Option<T>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            receive::<T>(self.recv.slot, &self.recv.topic, Some(self.deadline)).await
        })
    }
}

/// Takes the next message for step `slot` (the deadline at the slot after
/// it), or replays what that step took.
async fn receive<T: DeserializeOwned>(
    slot: Option<(Arc<WorkflowContext>, i64)>,
    topic: &str,
    deadline: Option<SystemTime>,
) -> Result<Option<T>> {
    let Some((cx, seq)) = slot else {
        return Err(Error::NotInWorkflow {
            op: format!("keiro::recv(\"{topic}\")"),
            instead: "messages are queued for a workflow instance; send one with keiro::send",
        });
    };
    Error::check_id("message topic", topic)?;
    let deadline = match deadline {
        None => None,
        Some(when) => Some(journal_deadline(&cx, seq + 1, when).await),
    };
    if let Some(row) = cx.recorded(seq) {
        return taken(&cx, seq, topic, &row);
    }
    super::pipeline::barrier(&cx).await;
    let store = cx.keiro.raw_store();
    let waiter = cx.keiro.waiter(&cx.id);
    let mut in_memory_until = tokio::time::Instant::now() + cx.suspend_after;
    let mut poll = RECV_POLL;
    let check = |message: &MessageRow| {
        serde_json::from_str::<T>(&message.payload)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    loop {
        let notified = waiter.notified();
        let expired = deadline.is_some_and(|d| cx.keiro.now_us() >= d);
        // A read first; taking (through the group-commit writer, shared
        // with other receivers' takes) only when there is something to take.
        let next = match store.next_message(&cx.id, topic).await {
            Ok(next) => next,
            Err(e) => return halt(&cx, Halt::Error(Error::Store(e))).await,
        };
        let receive = Receive {
            workflow_id: &cx.id,
            generation: cx.generation,
            seq,
            name: topic,
            kind: StepKind::Recv.as_str(),
            topic,
            when_empty: None,
        };
        match next {
            Some(message) => {
                if let Err(reason) = check(&message) {
                    return Err(Error::MessageType(Box::new(TypeMismatch {
                        what: format!("the next message on topic `{topic}`"),
                        workflow: Some(cx.name.clone()),
                        id: cx.id.clone(),
                        expected: std::any::type_name::<T>().to_owned(),
                        found: message.type_name.unwrap_or_else(|| "(unnamed type)".into()),
                        reason,
                    })));
                }
                match cx
                    .keiro
                    .writer()
                    .take_message(Take::new(&receive, &message))
                    .await
                {
                    Ok(Taken::Journaled(row)) => return taken(&cx, seq, topic, &row),
                    // A racing run of this instance took it: look again.
                    Ok(Taken::Gone) => continue,
                    Err(e) => return halt(&cx, Halt::Error(Error::Store(e))).await,
                }
            }
            None if expired => {
                let row = StepRow {
                    workflow_id: cx.id.clone(),
                    generation: cx.generation,
                    seq,
                    name: topic.to_owned(),
                    kind: StepKind::Recv.as_str().to_owned(),
                    result: TIMED_OUT.to_owned(),
                };
                return match cx.keiro.writer().append(row.clone()).await {
                    Ok(AppendOutcome::Inserted) => taken(&cx, seq, topic, &row),
                    Ok(AppendOutcome::Existing(first)) => taken(&cx, seq, topic, &first),
                    Err(e) => halt(&cx, Halt::Error(Error::Store(e))).await,
                };
            }
            None => {}
        }
        let now = tokio::time::Instant::now();
        if now >= in_memory_until {
            let suspend = Halt::Suspend {
                wake_at: deadline,
                awaiting: None,
                topic: Some(topic.to_owned()),
                waiting: Some(keiro_store::WaitingStep {
                    seq,
                    kind: "message".to_owned(),
                    name: topic.to_owned(),
                }),
            };
            match super::select::intercept(suspend) {
                Some(suspend) => return halt(&cx, suspend).await,
                // A select's branch: its wish is filed; it keeps waiting here
                // until the select suspends the run or another branch wins.
                None => in_memory_until = now + cx.suspend_after,
            }
        }
        let mut nap = poll.min(in_memory_until - now);
        poll = (poll * 2).min(RECV_POLL_MAX);
        if let Some(d) = deadline {
            nap = nap.min(Duration::from_micros((d - cx.keiro.now_us()).max(0) as u64));
        }
        tokio::select! {
            _ = notified => poll = RECV_POLL,
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// The deadline journaled at step `seq` (the first run's), in µs.
async fn journal_deadline(cx: &Arc<WorkflowContext>, seq: i64, when: SystemTime) -> i64 {
    let (kind, name) = (StepKind::Sleep, "recv deadline");
    match cx.recorded(seq) {
        Some(row) => super::step::replay(cx, seq, kind, name, &row).await,
        None => record(cx, seq, kind, name, to_us(when)).await,
    }
}

/// Reads what step `seq` took: a message, or `None` (its deadline passed).
fn taken<T: DeserializeOwned>(
    cx: &WorkflowContext,
    seq: i64,
    topic: &str,
    row: &StepRow,
) -> Result<Option<T>> {
    if row.kind != StepKind::Recv.as_str() || row.name != topic {
        let found = super::describe(StepKind::Recv.as_str(), topic);
        return Err(cx.non_deterministic(seq, row, found));
    }
    match Outcome::decode_as::<T, String>(&row.result) {
        Ok(Ok(value)) => Ok(Some(value)),
        Ok(Err(_)) => Ok(None),
        Err(e) => Err(Error::decode(
            format!(
                "the message workflow `{}` (id {}) took from topic `{topic}` at step {seq} into \
                 the awaited `{}`",
                cx.name,
                cx.id,
                std::any::type_name::<T>()
            ),
            e,
        )),
    }
}

/// Sends `value` on `topic` to workflow instance `workflow_id`, through the
/// process-wide runtime (or the one given to [`Sending::on`]). `.await` it
/// for `Result<(), Error>`: an unknown id is [`Error::NotFound`], an instance
/// that has ended is [`Error::NotReceiving`]. Inside a workflow the send is
/// journaled with the message in one transaction: it happens exactly once,
/// however often the workflow replays.
pub fn send<T: Serialize + ?Sized>(
    workflow_id: impl Into<String>,
    topic: impl Into<String>,
    value: &T,
) -> Sending {
    let topic = topic.into();
    let payload = crate::json::to_json(value, || format!("the message on topic `{topic}`"));
    Sending {
        workflow_id: workflow_id.into(),
        topic,
        payload,
        type_name: std::any::type_name::<T>(),
        idempotency_key: None,
        keiro: None,
        slot: claim_seq(),
    }
}

/// A message on its way ([`send`]); `.await` it.
#[must_use = "a send does nothing until it is awaited"]
pub struct Sending {
    workflow_id: String,
    topic: String,
    payload: Result<String>,
    type_name: &'static str,
    idempotency_key: Option<String>,
    keiro: Option<Keiro>,
    slot: Option<(Arc<WorkflowContext>, i64)>,
}

impl std::fmt::Debug for Sending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sending")
            .field("workflow_id", &self.workflow_id)
            .field("topic", &self.topic)
            .field("idempotency_key", &self.idempotency_key)
            .finish_non_exhaustive()
    }
}

impl Sending {
    /// Makes a retried send with the same `key` (to the same instance) a
    /// no-op, even after the first was received.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sends through `keiro` instead of the process-wide runtime (outside a
    /// workflow; inside one the workflow's runtime sends).
    pub fn on(mut self, keiro: &Keiro) -> Self {
        self.keiro = Some(keiro.clone());
        self
    }
}

impl IntoFuture for Sending {
    type Output = Result<()>;
    type IntoFuture = BoxFuture<'static, Result<()>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            match self.slot.clone() {
                Some((cx, seq)) => send_journaled(&cx, seq, self).await,
                None => {
                    let keiro = match &self.keiro {
                        Some(keiro) => keiro.clone(),
                        None => crate::runtime::global().await?,
                    };
                    keiro.send_message(&self, None).await
                }
            }
        })
    }
}

/// How a refused send is journaled, so a replay refuses it the same way.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Refusal {
    NotFound,
    NotReceiving(String),
}

/// A send inside a workflow at step `seq`: replayed, or sent with its step.
async fn send_journaled(cx: &Arc<WorkflowContext>, seq: i64, sending: Sending) -> Result<()> {
    let name = sending.topic.clone();
    let row = match cx.recorded(seq) {
        Some(row) => row,
        None => {
            let row = StepRow {
                workflow_id: cx.id.clone(),
                generation: cx.generation,
                seq,
                name: name.clone(),
                kind: StepKind::Send.as_str().to_owned(),
                result: "{\"Ok\":null}".to_owned(),
            };
            super::pipeline::barrier(cx).await;
            match cx.keiro.send_message(&sending, Some(&row)).await {
                Ok(()) => return Ok(()),
                Err(Error::Store(e)) => return halt(cx, Halt::Error(Error::Store(e))).await,
                Err(error) => {
                    let refusal = match &error {
                        Error::NotFound { .. } => Refusal::NotFound,
                        Error::NotReceiving { status, .. } => Refusal::NotReceiving(status.clone()),
                        // Bad input (encoding, an invalid id): nothing to journal.
                        _ => return Err(error),
                    };
                    let refused = StepRow {
                        result: Outcome::Err(serde_json::to_value(&refusal).unwrap_or_default())
                            .encode(),
                        ..row
                    };
                    match cx.keiro.writer().append(refused.clone()).await {
                        Ok(AppendOutcome::Inserted) => refused,
                        Ok(AppendOutcome::Existing(first)) => first,
                        Err(e) => return halt(cx, Halt::Error(Error::Store(e))).await,
                    }
                }
            }
        }
    };
    if row.kind != StepKind::Send.as_str() || row.name != name {
        let found = super::describe(StepKind::Send.as_str(), &name);
        return Err(cx.non_deterministic(seq, &row, found));
    }
    match Outcome::decode_as::<(), Refusal>(&row.result) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(Refusal::NotFound)) => Err(Error::NotFound {
            id: sending.workflow_id,
        }),
        Ok(Err(Refusal::NotReceiving(status))) => Err(Error::NotReceiving {
            id: sending.workflow_id,
            status,
        }),
        Err(e) => Err(Error::decode(
            format!(
                "the recorded send on topic `{name}` (seq {seq}) of workflow `{}` (id {})",
                cx.name, cx.id
            ),
            e,
        )),
    }
}

impl Keiro {
    /// [`send`] through this runtime: `keiro.send(id, topic, &value).await`.
    pub fn send<T: Serialize + ?Sized>(
        &self,
        workflow_id: impl Into<String>,
        topic: impl Into<String>,
        value: &T,
    ) -> Sending {
        send(workflow_id, topic, value).on(self)
    }

    /// Queues `sending`'s message (with `journal`, the sending step of a
    /// workflow, in the same transaction) and wakes its receiver.
    async fn send_message(&self, sending: &Sending, journal: Option<&StepRow>) -> Result<()> {
        Error::check_id("workflow id", &sending.workflow_id)?;
        Error::check_id("message topic", &sending.topic)?;
        if let Some(key) = &sending.idempotency_key {
            Error::check_id("idempotency key", key)?;
        }
        let payload = sending.payload.as_ref().map_err(Clone::clone)?;
        let sender = crate::context::current();
        crate::json::check_size(
            payload,
            self.max_payload_bytes(),
            sender
                .as_ref()
                .map_or("(outside a workflow)", |cx| &cx.name),
            &sending.workflow_id,
            || format!("the message on topic `{}`", sending.topic),
        )?;
        let request = MessageRequest {
            workflow_id: sending.workflow_id.clone(),
            topic: sending.topic.clone(),
            payload: payload.clone(),
            type_name: Some(sending.type_name.to_owned()),
            idempotency_key: sending.idempotency_key.clone(),
            journal: journal.cloned(),
        };
        let store = self.raw_store();
        // Through the group-commit writer: concurrent sends share a commit.
        if sent(
            &sending.workflow_id,
            self.writer().send_message(request).await?,
        )? {
            // A receiver in memory here wakes at once; a suspended one
            // is now due, for this process's resume worker or another's.
            self.step_recorded(&sending.workflow_id);
            self.wake_resume_worker();
            // The message is committed: a lost notification costs only
            // latency (receivers poll), so it never fails the send. On
            // PostgreSQL a send without journal step notified in its own
            // statement.
            let notified = journal.is_none() && store.notifies_sends();
            if let Err(error) = notified_or(store, &sending.workflow_id, notified).await {
                tracing::warn!(%error, "keiro could not notify a message's receiver");
            }
        }
        Ok(())
    }
}

/// Notifies the workers of `id`'s instance unless that was `done` already.
async fn notified_or(store: &keiro_store::Store, id: &str, done: bool) -> keiro_store::Result<()> {
    if done {
        return Ok(());
    }
    store.wake_workers(id).await
}

/// What a send's `outcome` means to the sender: `Ok(true)` when a message
/// was queued now, `Ok(false)` when it was before (idempotency key, replay).
fn sent(workflow_id: &str, outcome: SendOutcome) -> Result<bool> {
    match outcome {
        SendOutcome::Sent(_) => Ok(true),
        SendOutcome::Duplicate | SendOutcome::Replayed(_) => Ok(false),
        SendOutcome::NotFound => Err(Error::NotFound {
            id: workflow_id.to_owned(),
        }),
        SendOutcome::Finished(status) => Err(Error::NotReceiving {
            id: workflow_id.to_owned(),
            status: status.as_str().to_owned(),
        }),
    }
}

/// Sends `value` on `topic` to workflow instance `workflow_id` inside the
/// caller's own transaction on keiro's database (the outbox pattern): the
/// message is queued, and a suspended receiver made due, exactly when `tx`
/// commits, and not at all when it rolls back. Refused like [`send`] (an
/// unknown id is [`Error::NotFound`], an ended instance
/// [`Error::NotReceiving`]; then nothing was written). Needs no runtime;
/// meant for code outside workflows (inside one, [`send`] is journaled).
///
/// On PostgreSQL the receiver's process is notified at commit (`NOTIFY`
/// inside the transaction). On SQLite nothing can run at commit: a receiver
/// waiting in memory finds the message at its next look (every few
/// milliseconds), a suspended one when a resume worker next polls. On
/// SQLite begin the transaction with `BEGIN IMMEDIATE`
/// (`pool.begin_with("BEGIN IMMEDIATE")`), so it holds the write lock from
/// its first statement.
///
/// The message is stamped with the process-wide runtime's clock when one is
/// set up, else the system clock; [`Keiro::send_tx`] uses its runtime's
/// (a [`TestEnv`](crate::testing::TestEnv)'s virtual one).
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE accounts SET paid = true WHERE id = 7").execute(&mut *tx).await?;
/// keiro::send_tx(&mut tx, "order-42", "payment", &1999_u64).await?;
/// tx.commit().await?; // the payment and the message, together
/// # Ok(()) }
/// ```
pub async fn send_tx<'t, 'c, T: Serialize + ?Sized>(
    tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
    workflow_id: &str,
    topic: &str,
    value: &T,
) -> Result<()>
where
    'c: 't,
{
    send_tx_under(
        crate::runtime::try_global().as_ref(),
        tx,
        workflow_id,
        topic,
        value,
    )
    .await
}

impl Keiro {
    /// [`send_tx`] under this runtime: the message is stamped with its clock
    /// (a [`TestEnv`](crate::testing::TestEnv)'s virtual one, so a suspended
    /// receiver is due at the environment's time) and held to its payload
    /// limit.
    pub async fn send_tx<'t, 'c, T: Serialize + ?Sized>(
        &self,
        tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
        workflow_id: &str,
        topic: &str,
        value: &T,
    ) -> Result<()>
    where
        'c: 't,
    {
        send_tx_under(Some(self), tx, workflow_id, topic, value).await
    }
}

/// [`send_tx`] by `keiro`'s clock and payload limit, else the system clock
/// and the default limit.
async fn send_tx_under<'t, 'c, T: Serialize + ?Sized>(
    keiro: Option<&Keiro>,
    tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
    workflow_id: &str,
    topic: &str,
    value: &T,
) -> Result<()>
where
    'c: 't,
{
    Error::check_id("workflow id", workflow_id)?;
    Error::check_id("message topic", topic)?;
    let payload = crate::json::to_json(value, || format!("the message on topic `{topic}`"))?;
    let limit = keiro.map_or(crate::DEFAULT_MAX_PAYLOAD_BYTES, Keiro::max_payload_bytes);
    let now = keiro.map_or_else(keiro_store::now_us, Keiro::now_us);
    crate::json::check_size(&payload, limit, "(outside a workflow)", workflow_id, || {
        format!("the message on topic `{topic}`")
    })?;
    let message = NewMessage {
        workflow_id,
        topic,
        payload: &payload,
        type_name: Some(std::any::type_name::<T>()),
        idempotency_key: None,
        journal: None,
    };
    sent(
        workflow_id,
        keiro_store::send_message_tx(tx, &message, now).await?,
    )?;
    Ok(())
}
