//! Awakeables: durable promises a workflow creates, hands out by id, and
//! awaits; any process resolves or rejects them by that id.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::sync::Arc;

use keiro_store::{Outcome, Resolution, StepRow};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{claim_seqs, run_step, wait_for_step, StepKind, WorkflowContext};
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
    /// [`reject_awakeable`]. It is journaled before the workflow can hand it
    /// to anyone.
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
                let expected = short_type_name(std::any::type_name::<T>());
                let _: String = run_step(
                    cx.clone(),
                    created,
                    StepKind::Awakeable,
                    "awakeable",
                    async move { expected },
                )
                .await;
                Awakeable {
                    id: format!("{}/{}/{created}", cx.id, cx.generation),
                    slot: Some((cx, created + 1)),
                    _value: PhantomData,
                }
            }
        }
    }
}

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

/// `a::b::Thing<c::D>` → `Thing<D>`: the type as both sides of an awakeable
/// can name it, whichever crate declares it.
fn short_type_name(full: &str) -> String {
    let mut out = String::new();
    let mut segment = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            segment.push(c);
        } else {
            out.push_str(segment.rsplit("::").next().unwrap_or(""));
            segment.clear();
            out.push(c);
        }
    }
    out.push_str(segment.rsplit("::").next().unwrap_or(""));
    out
}

/// An awakeable id taken apart: workflow id, generation, creation step.
fn parse_id(id: &str) -> Result<(String, i64, i64)> {
    let unknown = || Error::UnknownAwakeable { id: id.to_owned() };
    let mut parts = id.rsplitn(3, '/');
    let seq = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(unknown)?;
    let generation = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(unknown)?;
    let workflow = parts.next().filter(|w| !w.is_empty()).ok_or_else(unknown)?;
    Ok((workflow.to_owned(), generation, seq))
}

impl Keiro {
    /// Answers awakeable `id` with `value`: journals it as the waiting step's
    /// result and makes the workflow due, in one transaction, then wakes it.
    /// An unknown id, a value of another type than the one awaited, and a
    /// second answer are refused with distinct errors; the first answer stands.
    pub async fn resolve_awakeable<T: Serialize>(&self, id: &str, value: T) -> Result<()> {
        let found = short_type_name(std::any::type_name::<T>());
        let value =
            crate::json::to_value(&value, || format!("the answer to awakeable `{id}` holds"))?;
        self.answer(id, Outcome::Ok(value), Some(found)).await
    }

    /// Rejects awakeable `id`: the workflow's `.await` yields
    /// [`Error::Rejected`] with `reason`.
    pub async fn reject_awakeable(&self, id: &str, reason: impl Into<String>) -> Result<()> {
        self.answer(
            id,
            Outcome::Err(serde_json::Value::String(reason.into())),
            None,
        )
        .await
    }

    async fn answer(&self, id: &str, answer: Outcome, found: Option<String>) -> Result<()> {
        // A workflow id and its suffix (generation, step, secret).
        Error::check_id_within("awakeable id", id, crate::MAX_ID_BYTES + 128)?;
        let (workflow, generation, created) = parse_id(id)?;
        let store = self.raw_store();
        let creation = store
            .get_step(&workflow, generation, created)
            .await?
            .filter(|row| row.kind == StepKind::Awakeable.as_str())
            .ok_or_else(|| Error::UnknownAwakeable { id: id.to_owned() })?;
        if let Some(found) = found {
            let expected: String = serde_json::from_str(&creation.result).unwrap_or_default();
            if expected != found {
                return Err(Error::AwakeableTypeMismatch {
                    id: id.to_owned(),
                    expected,
                    found,
                });
            }
        }
        let row = StepRow {
            workflow_id: workflow.clone(),
            generation,
            seq: created + 1,
            name: "awakeable".to_owned(),
            kind: RESOLUTION_KIND.to_owned(),
            result: answer.encode(),
        };
        match store
            .resolve(created, StepKind::Awakeable.as_str(), &row)
            .await?
        {
            Resolution::Recorded => {
                self.step_recorded(&workflow);
                // The answer is committed: a lost notification only costs
                // latency (workers poll), so it never fails the answer.
                if let Err(error) = store.wake_workers(&workflow).await {
                    tracing::warn!(%error, "keiro could not notify an awakeable's answer");
                }
                Ok(())
            }
            Resolution::AlreadyResolved(_) => Err(Error::AlreadyResolved { id: id.to_owned() }),
            Resolution::Unknown => Err(Error::UnknownAwakeable { id: id.to_owned() }),
        }
    }
}

/// Answers awakeable `id` with `value`, through the process-wide runtime.
pub async fn resolve_awakeable<T: Serialize>(id: &str, value: T) -> Result<()> {
    crate::runtime::global()
        .await?
        .resolve_awakeable(id, value)
        .await
}

/// Rejects awakeable `id` with `reason`, through the process-wide runtime.
pub async fn reject_awakeable(id: &str, reason: impl Into<String>) -> Result<()> {
    crate::runtime::global()
        .await?
        .reject_awakeable(id, reason)
        .await
}

#[cfg(test)]
mod tests {
    use super::{parse_id, short_type_name};

    #[test]
    fn type_names_drop_their_paths() {
        assert_eq!(short_type_name("alloc::string::String"), "String");
        assert_eq!(short_type_name("bool"), "bool");
        assert_eq!(
            short_type_name("alloc::vec::Vec<my_app::orders::Approval>"),
            "Vec<Approval>"
        );
        assert_eq!(
            short_type_name("(u32, core::option::Option<i8>)"),
            "(u32, Option<i8>)"
        );
    }

    #[test]
    fn ids_parse_from_the_right() {
        assert_eq!(
            parse_id("order-1/3/0/7").unwrap(),
            ("order-1/3".to_owned(), 0, 7)
        );
        assert!(parse_id("nonsense").is_err());
        assert!(parse_id("/0/1").is_err());
    }
}
