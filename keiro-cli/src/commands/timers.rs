//! `keiro timers …`: process-manager timers, page by page, and moving one.

use keiro::timers::{
    TimerChange, TimerError, TimerFilter, TimerId, TimerPage, TimerPageRequest, TimerRow,
    TimerStatus, Timers,
};
use keiro::Keiro;
use serde_json::json;

use crate::args::{TimerPageArgs, TimersCommand};
use crate::render::timer_json;
use crate::table::Table;
use crate::{clock, Failure, Report};

/// Runs one `keiro timers` command.
pub(crate) async fn run(keiro: &Keiro, command: TimersCommand) -> Result<Report, Failure> {
    let timers = keiro.timers();
    match command {
        TimersCommand::Pending(args) => {
            let page = timers.pending(&request(&args)).await?;
            Ok(page_report(&page, "FIRE AT", |t| clock::short(t.fire_at)))
        }
        TimersCommand::Stuck { page, older_than } => {
            let page = timers.stuck(older_than, &request(&page)).await?;
            Ok(page_report(&page, "CLAIMED", |t| {
                t.claimed_at.map(clock::short).unwrap_or_default()
            }))
        }
        TimersCommand::Dead(args) => {
            let page = timers.dead(&request(&args)).await?;
            Ok(page_report(&page, "DIED", |t| clock::short(t.updated_at)))
        }
        TimersCommand::Requeue { id } => {
            let id = TimerId::new(id);
            let change = timers.requeue(&id).await?;
            changed(&id, change, "requeue", "a firing or dead")
        }
        TimersCommand::Cancel { id } => {
            let id = TimerId::new(id);
            let change = timers.cancel(&id).await?;
            changed(&id, change, "cancel", "a scheduled, firing or dead")
        }
        TimersCommand::Resume { id } => resume(&timers, TimerId::new(id)).await,
    }
}

/// The page request `args` describe.
fn request(args: &TimerPageArgs) -> TimerPageRequest {
    let mut request = TimerPageRequest::first(args.limit).filter(TimerFilter {
        process_manager: args.pm.clone(),
        reason: None,
    });
    if let Some(cursor) = &args.cursor {
        request = request.after(cursor);
    }
    request
}

/// A page as a table whose time column is `when` (headed `when_header`).
fn page_report(
    page: &TimerPage,
    when_header: &'static str,
    when: fn(&TimerRow) -> String,
) -> Report {
    let mut table = Table::new(&[
        "ID",
        "PM",
        "CORRELATION",
        "STATUS",
        "ATT",
        when_header,
        "LAST ERROR",
    ]);
    for t in &page.items {
        table.row(vec![
            t.id.to_string(),
            t.process_manager.clone(),
            t.correlation_id.clone(),
            t.status.as_str().to_owned(),
            t.attempts.to_string(),
            when(t),
            t.last_error.clone().unwrap_or_default(),
        ]);
    }
    let human = table.page("no timers match", page.next_cursor.as_deref());
    Report {
        human,
        json: json!({
            "items": page.items.iter().map(timer_json).collect::<Vec<_>>(),
            "next_cursor": page.next_cursor,
        }),
    }
}

/// The report of a one-timer change, or the refusal naming the timer.
fn changed(id: &TimerId, change: TimerChange, verb: &str, takes: &str) -> Result<Report, Failure> {
    match change {
        TimerChange::Applied(timer) => Ok(Report {
            human: format!(
                "timer {id} is {} (fires at {}, {} attempts so far)\n",
                timer.status.as_str(),
                clock::short(timer.fire_at),
                timer.attempts
            ),
            json: timer_json(&timer),
        }),
        TimerChange::NotFound => Err(TimerError::NotFound { id: id.to_string() }.into()),
        TimerChange::NotApplicable(status) => Err(Failure::Refused(format!(
            "timer `{id}` is {}; {verb} takes {takes} timer, so nothing changed",
            status.as_str()
        ))),
    }
}

/// `keiro timers resume ID`: a dead timer back in line with zero attempts,
/// for a worker to fire again. Refused for any other status
/// ([`TimerError::NotDead`]: a stuck, `firing` one is for `requeue`; a
/// `resuming` one is held by a foreground resume claim). The status is read
/// first, then the timer requeued; the requeue itself refuses a timer a
/// foreground claim took in between.
async fn resume(timers: &Timers, id: TimerId) -> Result<Report, Failure> {
    let timer = timers
        .get(&id)
        .await?
        .ok_or_else(|| TimerError::NotFound { id: id.to_string() })?;
    if timer.status != TimerStatus::Dead {
        return Err(TimerError::NotDead {
            id: id.to_string(),
            status: timer.status,
        }
        .into());
    }
    let change = timers.requeue(&id).await?;
    changed(&id, change, "resume", "a dead")
}
