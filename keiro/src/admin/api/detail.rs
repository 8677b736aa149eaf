//! One instance as its page shows it: summary, input and output, the
//! current generation's journal, children, and what still waits for an
//! answer (awakeables) or a receiver (messages).

use serde_json::{json, Value};

use crate::admin::json;
use crate::{Keiro, ListFilter, Result, StepRecord, WorkflowStatus, WorkflowSummary};

/// The most children and waiting messages a detail lists; the children
/// listing says when there are more (`children_next_cursor`, for
/// `GET /api/instances?parent_id=`).
pub(crate) const DETAIL_LIMIT: u32 = 100;

/// Everything the instance page shows about one instance.
#[derive(Debug, Clone)]
pub(crate) struct Detail {
    /// Its summary.
    pub(crate) summary: WorkflowSummary,
    /// Its input (of the current generation), as JSON.
    pub(crate) input: Value,
    /// Its output once it ended with one.
    pub(crate) output: Option<Value>,
    /// The current generation's journal, in order.
    pub(crate) steps: Vec<StepRecord>,
    /// Its first [`DETAIL_LIMIT`] children, oldest first.
    pub(crate) children: Vec<WorkflowSummary>,
    /// Where the children listing continues, when there are more.
    pub(crate) children_next_cursor: Option<String>,
    /// Its awakeables nobody answered yet (none once it ended).
    pub(crate) awakeables: Vec<PendingAwakeable>,
    /// Messages sent to it that it has not received yet.
    pub(crate) messages: Vec<keiro_store::WaitingMessage>,
}

/// An awakeable of an unfinished instance that has no answer yet.
#[derive(Debug, Clone)]
pub(crate) struct PendingAwakeable {
    /// The id answering it takes.
    pub(crate) id: String,
    /// The seq of the journal entry that created it.
    pub(crate) seq: i64,
    /// The type the workflow awaits, as recorded.
    pub(crate) awaited_type: Option<String>,
    /// When it was created.
    pub(crate) created_at: std::time::SystemTime,
}

impl Detail {
    /// Reads instance `id`'s detail ([`crate::Error::NotFound`] for an
    /// unknown id).
    pub(crate) async fn load(keiro: &Keiro, id: &str) -> Result<Detail> {
        crate::Error::check_id("workflow id", id)?;
        // One read of the row gives both the summary and the input/output.
        let listed = keiro
            .raw_store()
            .get_summary(id)
            .await?
            .ok_or_else(|| crate::Error::NotFound { id: id.to_owned() })?;
        let summary = WorkflowSummary::of(&listed);
        let row = &listed.row;
        let steps = keiro.steps_of(id, summary.generation).await?;
        let children = keiro
            .list(
                &ListFilter::default()
                    .parent_id(id)
                    .oldest_first()
                    .limit(DETAIL_LIMIT),
            )
            .await?;
        let unfinished = matches!(
            summary.status,
            WorkflowStatus::Pending | WorkflowStatus::Running | WorkflowStatus::Suspended
        );
        let awakeables = if unfinished {
            pending_awakeables(id, summary.generation, &steps)
        } else {
            Vec::new()
        };
        let messages = keiro
            .raw_store()
            .waiting_messages(id, i64::from(DETAIL_LIMIT))
            .await?;
        Ok(Detail {
            input: json::stored(&row.input),
            output: row.output.as_deref().map(json::stored),
            summary,
            steps,
            children: children.items,
            children_next_cursor: children.next_cursor,
            awakeables,
            messages,
        })
    }

    /// The detail as the API answers it.
    pub(crate) fn to_json(&self) -> Value {
        let id = &self.summary.id;
        let generation = self.summary.generation;
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|step| {
                let mut entry = json::step(step);
                if let Some(awakeable) = json::awakeable_id(id, generation, step) {
                    entry["awakeable_id"] = awakeable.into();
                }
                entry
            })
            .collect();
        json!({
            "instance": json::summary(&self.summary),
            "input": self.input,
            "output": self.output,
            "steps": steps,
            "children": self.children.iter().map(json::summary).collect::<Vec<_>>(),
            "children_next_cursor": self.children_next_cursor,
            "awakeables": self.awakeables.iter().map(|a| json!({
                "id": a.id,
                "seq": a.seq,
                "awaited_type": a.awaited_type,
                "created_at": json::rfc3339(a.created_at),
            })).collect::<Vec<_>>(),
            "messages": self.messages.iter().map(|m| json!({
                "topic": m.topic,
                "value": json::stored(&m.message.payload),
                "type_name": m.message.type_name,
                "sent_at": json::rfc3339(crate::time::from_us(m.message.sent_at)),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The awakeables in `steps` (instance `id`, generation `generation`)
/// whose answer, the entry right after their creation, is not journaled.
fn pending_awakeables(id: &str, generation: i64, steps: &[StepRecord]) -> Vec<PendingAwakeable> {
    let answered = |seq: i64| steps.iter().any(|step| step.seq == seq + 1);
    steps
        .iter()
        .filter(|step| !answered(step.seq))
        .filter_map(|step| {
            Some(PendingAwakeable {
                id: json::awakeable_id(id, generation, step)?,
                seq: step.seq,
                awaited_type: match &step.value {
                    Value::Object(fields) => fields.get("type").and_then(Value::as_str),
                    Value::String(short) => Some(short.as_str()),
                    _ => None,
                }
                .map(str::to_owned),
                created_at: step.finished_at,
            })
        })
        .collect()
}
