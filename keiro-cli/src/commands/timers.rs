//! `keiro timers …`: process-manager timers, page by page, and moving one.

use keiro::timers::{
    TimerAction, TimerChange, TimerFilter, TimerId, TimerPage, TimerPageRequest, TimerRow,
};
use keiro::Keiro;
use serde_json::json;

use crate::args::{TimerPageArgs, TimersCommand};
use crate::table::Table;
use crate::{clock, Failure, Report};
use keiro::admin::json::timer as timer_json;

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
            changed(&id, change, TimerAction::Requeue)
        }
        TimersCommand::Cancel { id } => {
            let id = TimerId::new(id);
            let change = timers.cancel(&id).await?;
            changed(&id, change, TimerAction::Cancel)
        }
        // A dead timer back in line with zero attempts; any other status
        // is refused (`TimerError::NotDead`).
        TimersCommand::Resume { id } => Ok(report(&timers.requeue_dead(&TimerId::new(id)).await?)),
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
fn changed(id: &TimerId, change: TimerChange, action: TimerAction) -> Result<Report, Failure> {
    Ok(report(&change.applied(id, action)?))
}

/// The report of a timer as a change left it.
fn report(timer: &TimerRow) -> Report {
    Report {
        human: format!(
            "timer {} is {} (fires at {}, {} attempts so far)\n",
            timer.id,
            timer.status.as_str(),
            clock::short(timer.fire_at),
            timer.attempts
        ),
        json: timer_json(timer),
    }
}
