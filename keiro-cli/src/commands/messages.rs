//! `keiro resolve`, `reject` and `send`: answering a workflow from outside.

use keiro::Keiro;
use serde_json::{json, Value};

use crate::render::compact;
use crate::{Failure, Report};

/// `keiro resolve AWAKEABLE_ID JSON`.
pub(crate) async fn resolve(keiro: &Keiro, id: &str, value: Value) -> Result<Report, Failure> {
    let text = compact(&value);
    keiro.resolve_awakeable_json(id, value).await?;
    Ok(Report {
        human: format!("resolved awakeable {id} with {text}; its workflow is due\n"),
        json: json!({ "awakeable_id": id, "resolved": true }),
    })
}

/// `keiro reject AWAKEABLE_ID REASON`.
pub(crate) async fn reject(keiro: &Keiro, id: &str, reason: &str) -> Result<Report, Failure> {
    keiro.reject_awakeable(id, reason).await?;
    Ok(Report {
        human: format!("rejected awakeable {id}; its workflow is due\n"),
        json: json!({ "awakeable_id": id, "rejected": true, "reason": reason }),
    })
}

/// `keiro send ID TOPIC JSON [--idempotency-key KEY]`.
pub(crate) async fn send(
    keiro: &Keiro,
    id: &str,
    topic: &str,
    value: &Value,
    idempotency_key: Option<String>,
) -> Result<Report, Failure> {
    let mut sending = keiro.send(id, topic, value);
    if let Some(key) = idempotency_key {
        sending = sending.idempotency_key(key);
    }
    sending.await?;
    Ok(Report {
        human: format!("sent {} on topic `{topic}` to {id}\n", compact(value)),
        json: json!({ "id": id, "topic": topic, "sent": true }),
    })
}
