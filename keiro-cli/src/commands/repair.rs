//! `keiro cancel`, `retry`, `resume` and `fork`: changing an instance's
//! course. None of them runs anything here; a worker that links the
//! workflow picks the instance up.

use keiro::{CancelOutcome, ForkFrom, Keiro};
use serde_json::json;

use crate::{Failure, Report};
use keiro::admin::json::status_name;

/// The workflow name and status of instance `id` as stored now.
async fn state(keiro: &Keiro, id: &str) -> Result<(String, &'static str), Failure> {
    let row = keiro
        .store()
        .get_instance(id)
        .await?
        .ok_or_else(|| keiro::Error::NotFound { id: id.to_owned() })?;
    Ok((row.name, row.status.as_str()))
}

/// `keiro cancel ID`.
pub(crate) async fn cancel(keiro: &Keiro, id: &str) -> Result<Report, Failure> {
    match keiro.cancel(id).await? {
        CancelOutcome::Cancelled { ids } => {
            let human = match ids.len() {
                1 => format!("cancelled {id}\n"),
                n => format!(
                    "cancelled {id} and {} unfinished descendant{}: {}\n",
                    n - 1,
                    if n == 2 { "" } else { "s" },
                    ids[1..].join(", ")
                ),
            };
            Ok(Report {
                human,
                json: json!({ "id": id, "cancelled": ids }),
            })
        }
        CancelOutcome::AlreadyFinished(status) => Ok(Report {
            human: format!(
                "{id} had already ended ({}); nothing changed\n",
                status_name(&status)
            ),
            json: json!({ "id": id, "cancelled": [], "already_finished": status_name(&status) }),
        }),
        other => Err(Failure::Refused(format!(
            "cancelling {id} ended in a way this keiro command does not know: {other:?}"
        ))),
    }
}

/// `keiro retry ID`.
pub(crate) async fn retry(keiro: &Keiro, id: &str) -> Result<Report, Failure> {
    keiro.retry(id).await?;
    let (name, status) = state(keiro, id).await?;
    Ok(Report {
        human: format!(
            "{id} is {status} again: a worker that links workflow `{name}` runs it from its \
             journal\n"
        ),
        json: json!({ "id": id, "name": name, "status": status }),
    })
}

/// `keiro resume ID`.
pub(crate) async fn resume(keiro: &Keiro, id: &str) -> Result<Report, Failure> {
    keiro.resume(id).await?;
    let (name, status) = state(keiro, id).await?;
    Ok(Report {
        human: format!(
            "{id} is {status} again, journal intact: a worker that links the fixed workflow \
             `{name}` resumes it\n"
        ),
        json: json!({ "id": id, "name": name, "status": status }),
    })
}

/// `keiro fork ID --from SEQ [--id NEW]`.
pub(crate) async fn fork(
    keiro: &Keiro,
    id: &str,
    from: i64,
    new_id: Option<&str>,
) -> Result<Report, Failure> {
    if from < 0 {
        return Err(Failure::Usage(format!(
            "--from {from} is not a journal position; give a seq of `keiro show {id}` (0 or more)"
        )));
    }
    let forked = match new_id {
        Some(new_id) => {
            keiro.fork_as(id, ForkFrom::Step(from), new_id).await?;
            new_id.to_owned()
        }
        None => keiro.fork(id, ForkFrom::Step(from)).await?,
    };
    let (name, status) = state(keiro, &forked).await?;
    Ok(Report {
        human: format!(
            "forked {id} from step {from} as {forked} ({status}): a worker that links workflow \
             `{name}` runs it from there\n"
        ),
        json: json!({ "id": forked, "forked_from": id, "from_seq": from, "name": name, "status": status }),
    })
}
