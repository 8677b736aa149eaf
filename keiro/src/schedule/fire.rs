//! Creating one tick's instance: the id derived from the schedule and the
//! tick, the arguments (the tick time, or a dynamic schedule's stored call),
//! then either the normal enqueue path (whichever resume worker claims it
//! first runs it) or, from a scheduler, a run started at once in its own
//! process.

use keiro_store::{CreateRequest, ScheduleRow};

use super::spec::tick_id;
use super::tick_runs::TickRuns;
use crate::resume::Held;
use crate::{Error, Keiro, Result};

/// Where a tick's new instance runs.
pub(crate) enum Start<'a> {
    /// Pending, for whichever resume worker serving the workflow claims it
    /// first (a trigger or a backfill, from any process).
    Pending,
    /// Created under this process's lease and driven at once by the
    /// scheduler's worker in the slot of its concurrency held here, so no
    /// claim and no resume pass stand between the tick and its first step.
    Here(&'a TickRuns, Held),
}

/// Creates the instance of `row`'s tick at `tick_us` under `id` unless it
/// exists already and starts it as `start` says ([`fire`] also records the
/// tick; a trigger does not). Returns
/// whether it was created. Workers racing on one tick create it once: the
/// id is unique, and only the creator runs it.
pub(crate) async fn fire_as(
    keiro: &Keiro,
    row: &ScheduleRow,
    tick_us: i64,
    id: String,
    start: Start<'_>,
) -> Result<bool> {
    // A process that does not link the workflow (the `keiro` command, a web
    // process) records no signature and no application version: any worker
    // serving the name runs it. A process linking it records its own, like
    // any other new instance.
    let registry = keiro.registry();
    let signature = registry.signature(&row.workflow).map(str::to_owned);
    let app_version = signature.as_ref().map(|_| keiro.app_version().to_owned());
    let skeleton_hash = registry.skeleton_hash(&row.workflow).map(str::to_owned);
    let runs = match start {
        Start::Here(runs, slot) if signature.is_some() => Some((runs, slot)),
        _ => None,
    };
    let lease = runs.as_ref().map(|_| {
        (
            keiro.owner().to_owned(),
            crate::time::duration_us(keiro.lease_ttl()),
        )
    });
    let input = match &row.input {
        Some(input) => input.clone(),
        None => crate::json::to_json(&(crate::time::from_us(tick_us),), || {
            format!("the tick time of schedule `{}`", row.name)
        })?,
    };
    let (existing, created) = keiro
        .writer()
        .create(CreateRequest {
            signature,
            lease,
            app_version,
            skeleton_hash,
            ..CreateRequest::new(id.clone(), row.workflow.clone(), input)
        })
        .await?;
    if existing.name != row.workflow {
        return Err(Error::IdConflict {
            id,
            existing: existing.name,
            requested: row.workflow.clone(),
            held_as: String::new(),
            requested_as: format!(" for a tick of schedule `{}`", row.name),
        });
    }
    match (created, runs) {
        (true, Some((runs, slot))) => runs.start(keiro, existing, slot),
        (true, None) => keiro.wake_all_workers("a cron tick").await,
        (false, _) => {}
    }
    Ok(created)
}

/// [`fire_as`] under the tick's own id ([`tick_id`]).
pub(crate) async fn fire(
    keiro: &Keiro,
    row: &ScheduleRow,
    tick_us: i64,
    start: Start<'_>,
) -> Result<bool> {
    let created = fire_as(keiro, row, tick_us, tick_id(&row.name, tick_us), start).await?;
    // (Not a trigger's run, which is no tick: a missed tick stays missed.)
    keiro
        .raw_store()
        .record_schedule_tick(&row.name, tick_us)
        .await?;
    Ok(created)
}
