//! Awakeables: durable promises a workflow creates, hands out by id, and
//! awaits; any process resolves or rejects them by that id.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keiro_store::{Outcome, Resolution, StepRow};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::awakeable_id::AwakeableId;
use super::awakeable_record::{check_decodes, know_decoder, Created};
use super::select::with_deadline;
use super::{claim_seqs, run_step, wait_for_step, Durable, StepKind, WorkflowContext};
use crate::registry::BoxFuture;
use crate::{Error, Keiro, Result};

/// The kind of the journal row that records an awakeable's resolution.
pub(crate) const RESOLUTION_KIND: &str = "resolution";

/// A durable promise created by [`awakeable`]. Hand [`Awakeable::id`] to
/// whoever will answer; `.await` it for the answer.
#[must_use = "an awakeable does nothing until it is awaited"]
pub struct Awakeable<T> {
    id: String,
    slot: Option<(Arc<WorkflowContext>, i64)>,
    _value: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Awakeable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Awakeable").field("id", &self.id).finish()
    }
}

impl<T> Awakeable<T> {
    /// The id another process passes to [`resolve_awakeable`] or
    /// [`reject_awakeable`]: `<workflow id>/<generation>/<step>/<secret>`,
    /// the secret random and journaled, so whoever holds the id can answer
    /// and nobody can guess it. It is journaled before the workflow can hand
    /// it to anyone, and a replay hands out the same id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Creates an awakeable whose answer has type `T`. Inside a workflow its id is
/// durable before this returns; awaiting it waits in memory for a short while
/// and then suspends the workflow (a row, no task) until it is resolved.
/// Outside a workflow, awaiting it is an error.
///
/// ```no_run
/// #[keiro::step]
/// async fn ask_approver(awakeable_id: String) -> Result<(), String> {
///     // e.g. e-mail a link that calls keiro::resolve_awakeable(&awakeable_id, true)
///     Ok(())
/// }
///
/// #[keiro::workflow]
/// async fn expense(cents: u64) -> Result<bool, String> {
///     let approval = keiro::awakeable::<bool>().await;
///     ask_approver(approval.id().to_owned()).await?;
///     // Waits (suspended, costing only a row) until another process answers.
///     approval.await.map_err(|e| e.to_string())
/// }
///
/// // In any process sharing the database, e.g. a web handler:
/// # async fn handler(id: String) -> Result<(), keiro::Error> {
/// keiro::resolve_awakeable(&id, true).await?;
/// # Ok(()) }
/// ```
pub fn awakeable<T>() -> impl Future<Output = Awakeable<T>> + Send
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    // Two ids: the creation, and the resolution that will fill the next one.
    let slot = claim_seqs(2);
    async move {
        match slot {
            None => Awakeable {
                id: String::new(),
                slot: None,
                _value: PhantomData,
            },
            Some((cx, created)) => {
                know_decoder::<T>();
                // The type and the secret are journaled, so a replay hands
                // out the same id.
                let record: serde_json::Value = run_step(
                    cx.clone(),
                    created,
                    StepKind::Awakeable,
                    "awakeable",
                    async move { Created::new_value::<T>() },
                )
                .await;
                let secret =
                    Created::from_value(&record).and_then(|c| c.secret().map(str::to_owned));
                Awakeable {
                    id: AwakeableId::format(&cx.id, cx.generation, created, secret.as_deref()),
                    slot: Some((cx, created + 1)),
                    _value: PhantomData,
                }
            }
        }
    }
}

impl<T: DeserializeOwned + Send + 'static> Awakeable<T> {
    /// Waits for the answer at most `duration` (from now, journaled when the
    /// wait first runs: a crash or replay keeps the original deadline);
    /// `Ok(None)` once it has passed unanswered. An answer given later is
    /// recorded but nobody reads it.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// #[keiro::workflow]
    /// async fn approve(cents: u64) -> Result<bool, String> {
    ///     let approval = keiro::awakeable::<bool>().await;
    ///     // Nobody answered within a day: refuse.
    ///     let answer = approval
    ///         .timeout(Duration::from_secs(86_400))
    ///         .await
    ///         .map_err(|e| e.to_string())?;
    ///     Ok(answer.unwrap_or(false))
    /// }
    /// ```
    pub fn timeout(self, duration: Duration) -> AwakeableTimeout<T> {
        AwakeableTimeout {
            deadline: super::clock_now() + duration,
            // The deadline, and which came first.
            slot: claim_seqs(2),
            awakeable: self,
        }
    }
}

/// An [`Awakeable`] with a deadline ([`Awakeable::timeout`]); yields
/// `Ok(None)` when it passes first.
#[must_use = "an awakeable does nothing until it is awaited"]
pub struct AwakeableTimeout<T> {
    awakeable: Awakeable<T>,
    deadline: SystemTime,
    slot: Option<(Arc<WorkflowContext>, i64)>,
}

impl<T> std::fmt::Debug for AwakeableTimeout<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwakeableTimeout")
            .field("id", &self.awakeable.id)
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for AwakeableTimeout<T> {
    type Output = Result<Option<T>>;
    type IntoFuture = BoxFuture<'static, Result<Option<T>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (Some((cx, seq)), Some(_)) = (self.slot, &self.awakeable.slot) else {
                return Err(Error::NotInWorkflow {
                    op: "awaiting keiro::awakeable().timeout(..)".into(),
                    instead: "outside a workflow it has nobody to wake",
                });
            };
            with_deadline(cx, seq, self.deadline, self.awakeable.into_future())
                .await
                .transpose()
        })
    }
}

impl<T: DeserializeOwned + Send + 'static> Durable for Awakeable<T> {}
impl<T: DeserializeOwned + Send + 'static> Durable for AwakeableTimeout<T> {}

impl<T> IntoFuture for Awakeable<T>
where
    T: DeserializeOwned + Send + 'static,
{
    type Output = Result<T>;
    type IntoFuture = BoxFuture<'static, Result<T>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Some((cx, seq)) = self.slot else {
                return Err(Error::NotInWorkflow {
                    op: "awaiting keiro::awakeable()".into(),
                    instead: "outside a workflow it has nobody to wake",
                });
            };
            let row = wait_for_step(&cx, seq, RESOLUTION_KIND, "awakeable").await;
            decode_resolution(&cx, &self.id, &row)
        })
    }
}

fn decode_resolution<T: DeserializeOwned>(
    cx: &WorkflowContext,
    id: &str,
    row: &StepRow,
) -> Result<T> {
    let answer = Outcome::decode_as::<T, String>(&row.result).map_err(|e| {
        Error::decode(
            format!(
                "the answer to awakeable {id} of workflow `{}` (id {}) into the awaited type",
                cx.name, cx.id
            ),
            e,
        )
    })?;
    match answer {
        Ok(value) => Ok(value),
        Err(reason) => Err(Error::Rejected {
            id: id.to_owned(),
            reason,
        }),
    }
}

impl Keiro {
    /// Answers awakeable `id` with `value`: journals it as the waiting step's
    /// result and makes the workflow due, in one transaction, then wakes it.
    /// Refused, with distinct errors and nothing recorded: an unknown id (or
    /// one whose secret part is wrong: [`Error::UnknownAwakeable`]), a value
    /// of another type than the one awaited (compared by full path:
    /// [`Error::AwakeableTypeMismatch`]), a value that does not decode into
    /// the awaited type when this process knows it
    /// ([`Error::AwakeableAnswerInvalid`]), an awakeable of a workflow that
    /// has ended ([`Error::AwakeableWorkflowFinished`]), and a second answer
    /// ([`Error::AlreadyResolved`]): the first answer stands.
    pub async fn resolve_awakeable<T: Serialize>(&self, id: &str, value: T) -> Result<()> {
        let value =
            crate::json::to_value(&value, || format!("the answer to awakeable `{id}` holds"))?;
        self.answer(id, Outcome::Ok(value), Some(std::any::type_name::<T>()))
            .await
    }

    /// Rejects awakeable `id`: the workflow's `.await` yields
    /// [`Error::Rejected`] with `reason`. Refused like
    /// [`Keiro::resolve_awakeable`] for an unknown id, an ended workflow and
    /// an awakeable answered before.
    pub async fn reject_awakeable(&self, id: &str, reason: impl Into<String>) -> Result<()> {
        self.answer(
            id,
            Outcome::Err(serde_json::Value::String(reason.into())),
            None,
        )
        .await
    }

    /// Answers awakeable `id` with a JSON value of no Rust type, for tools
    /// that link no workflow code (the `keiro resolve` command). Refused like
    /// [`Keiro::resolve_awakeable`], except that the value's type cannot be
    /// compared with the awaited one: it is checked where the workflow reads
    /// it, and a value that does not decode into the awaited type makes the
    /// workflow's `.await` return [`Error::Decode`] (as a changed type would).
    pub async fn resolve_awakeable_json(&self, id: &str, value: serde_json::Value) -> Result<()> {
        let value =
            crate::json::to_value(&value, || format!("the answer to awakeable `{id}` holds"))?;
        self.answer(id, Outcome::Ok(value), None).await
    }

    async fn answer(&self, id: &str, answer: Outcome, found: Option<&str>) -> Result<()> {
        let parsed = parse_answer_id(id)?;
        let store = self.raw_store();
        let creation = store
            .get_step(&parsed.workflow, parsed.generation, parsed.seq)
            .await?;
        let limit = self.max_payload_bytes();
        let row = answer_row(id, &parsed, creation, answer, found, limit)?;
        let resolution = store
            .resolve(parsed.seq, StepKind::Awakeable.as_str(), &row)
            .await?;
        answered(id, parsed.workflow.clone(), parsed.generation, resolution)?;
        self.step_recorded(&parsed.workflow);
        // The answer is committed: a lost notification only costs latency
        // (workers poll), so it never fails the answer.
        if let Err(error) = store.wake_workers(&parsed.workflow).await {
            tracing::warn!(%error, "keiro could not notify an awakeable's answer");
        }
        Ok(())
    }
}

/// Checks and takes apart an awakeable id given to answer it.
fn parse_answer_id(id: &str) -> Result<AwakeableId> {
    // A workflow id and its suffix (generation, step, secret).
    Error::check_id_within("awakeable id", id, crate::MAX_ID_BYTES + 128)?;
    AwakeableId::parse(id).ok_or_else(|| Error::UnknownAwakeable { id: id.to_owned() })
}

/// The journal row answering awakeable `id` with `answer` (of type `found`,
/// when a value), given its creation step as recorded: refused when there
/// is none, the secret is wrong, the answer is longer than `limit` bytes
/// encoded, or the type differs from the awaited one.
fn answer_row(
    id: &str,
    parsed: &AwakeableId,
    creation: Option<StepRow>,
    answer: Outcome,
    found: Option<&str>,
    limit: usize,
) -> Result<StepRow> {
    let unknown = || Error::UnknownAwakeable { id: id.to_owned() };
    let creation = creation
        .filter(|row| row.kind == StepKind::Awakeable.as_str())
        .ok_or_else(unknown)?;
    let created = Created::from_text(&creation.result).ok_or_else(unknown)?;
    // A wrong secret is as unknown as a wrong workflow: which part was
    // wrong is not told.
    if !parsed.carries(created.secret()) {
        return Err(unknown());
    }
    let encoded = answer.encode();
    let what = if found.is_some() {
        "answer"
    } else {
        "rejection"
    };
    crate::json::check_size(
        &encoded,
        limit,
        "(outside a workflow)",
        &parsed.workflow,
        || format!("the {what} to awakeable `{id}`"),
    )?;
    if let Some(found) = found {
        if !created.accepts_type(found) {
            return Err(Error::AwakeableTypeMismatch {
                id: id.to_owned(),
                expected: created.type_name().to_owned(),
                found: found.to_owned(),
            });
        }
        check_decodes(created.type_name(), &encoded).map_err(|message| {
            Error::AwakeableAnswerInvalid {
                id: id.to_owned(),
                expected: created.type_name().to_owned(),
                found: found.to_owned(),
                message,
            }
        })?;
    }
    Ok(StepRow {
        workflow_id: parsed.workflow.clone(),
        generation: parsed.generation,
        seq: parsed.seq + 1,
        name: "awakeable".to_owned(),
        kind: RESOLUTION_KIND.to_owned(),
        result: encoded,
    })
}

/// What the store's `resolution` of awakeable `id` (of instance `workflow`,
/// generation `generation`) means to the answerer: `Ok` once recorded.
fn answered(id: &str, workflow: String, generation: i64, resolution: Resolution) -> Result<()> {
    match resolution {
        Resolution::Recorded => Ok(()),
        Resolution::AlreadyResolved(_) => Err(Error::AlreadyResolved { id: id.to_owned() }),
        Resolution::Unknown => Err(Error::UnknownAwakeable { id: id.to_owned() }),
        Resolution::Finished(status) => Err(Error::AwakeableWorkflowFinished {
            id: id.to_owned(),
            workflow_id: workflow,
            status: status.as_str().to_owned(),
        }),
        Resolution::Continued(now) => Err(Error::AwakeableWorkflowFinished {
            id: id.to_owned(),
            workflow_id: workflow,
            status: format!(
                "past generation {generation} (continued as new; now generation {now})"
            ),
        }),
    }
}

/// Answers awakeable `id` with `value` inside the caller's own transaction
/// on keiro's database (the outbox pattern): the answer is recorded, and
/// the workflow made due, exactly when `tx` commits, and not at all when it
/// rolls back. Refused like [`Keiro::resolve_awakeable`] (then nothing was
/// written). Needs no runtime.
///
/// On PostgreSQL the workflow's process is notified at commit (`NOTIFY`
/// inside the transaction). On SQLite nothing can run at commit: a workflow
/// waiting in memory, or a resume worker, finds the answer when it next
/// looks (its poll interval). On SQLite begin the transaction with
/// `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`).
///
/// The answer is recorded at the process-wide runtime's time when one is
/// set up, else the system clock's; [`Keiro::resolve_awakeable_tx`] uses
/// its runtime's (a [`TestEnv`](crate::testing::TestEnv)'s virtual one).
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, id: String) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE orders SET approved = true WHERE id = 42").execute(&mut *tx).await?;
/// keiro::resolve_awakeable_tx(&mut tx, &id, &true).await?;
/// tx.commit().await?; // the approval and the answer, together
/// # Ok(()) }
/// ```
pub async fn resolve_awakeable_tx<'t, 'c, T: Serialize + ?Sized>(
    tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
    id: &str,
    value: &T,
) -> Result<()>
where
    'c: 't,
{
    resolve_awakeable_tx_under(crate::runtime::try_global().as_ref(), tx, id, value).await
}

impl Keiro {
    /// [`resolve_awakeable_tx`] under this runtime: the answer is recorded at
    /// its clock's time (a [`TestEnv`](crate::testing::TestEnv)'s virtual
    /// one, so the workflow is due at the environment's time) and held to
    /// its payload limit.
    pub async fn resolve_awakeable_tx<'t, 'c, T: Serialize + ?Sized>(
        &self,
        tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
        id: &str,
        value: &T,
    ) -> Result<()>
    where
        'c: 't,
    {
        resolve_awakeable_tx_under(Some(self), tx, id, value).await
    }
}

/// [`resolve_awakeable_tx`] by `keiro`'s clock and payload limit, else the
/// system clock and the default limit.
async fn resolve_awakeable_tx_under<'t, 'c, T: Serialize + ?Sized>(
    keiro: Option<&Keiro>,
    tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
    id: &str,
    value: &T,
) -> Result<()>
where
    'c: 't,
{
    let value = crate::json::to_value(value, || format!("the answer to awakeable `{id}` holds"))?;
    let parsed = parse_answer_id(id)?;
    let mut tx = tx.into();
    let creation = keiro_store::get_step_tx(
        tx.reborrow(),
        &parsed.workflow,
        parsed.generation,
        parsed.seq,
    )
    .await?;
    let limit = keiro.map_or(crate::DEFAULT_MAX_PAYLOAD_BYTES, Keiro::max_payload_bytes);
    let now = keiro.map_or_else(keiro_store::now_us, Keiro::now_us);
    let row = answer_row(
        id,
        &parsed,
        creation,
        Outcome::Ok(value),
        Some(std::any::type_name::<T>()),
        limit,
    )?;
    let resolution =
        keiro_store::resolve_tx(tx, parsed.seq, StepKind::Awakeable.as_str(), &row, now).await?;
    answered(id, parsed.workflow, parsed.generation, resolution)
}

/// Answers awakeable `id` with `value`, through the process-wide runtime
/// (see [`Keiro::resolve_awakeable`] for what is refused).
pub async fn resolve_awakeable<T: Serialize>(id: &str, value: T) -> Result<()> {
    crate::runtime::global()
        .await?
        .resolve_awakeable(id, value)
        .await
}

/// Rejects awakeable `id` with `reason`, through the process-wide runtime
/// (see [`Keiro::reject_awakeable`] for what is refused).
pub async fn reject_awakeable(id: &str, reason: impl Into<String>) -> Result<()> {
    crate::runtime::global()
        .await?
        .reject_awakeable(id, reason)
        .await
}
