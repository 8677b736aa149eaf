//! `keiro schedules …`: the cron schedules, and pausing, resuming or
//! triggering one.

use keiro::{Keiro, ScheduleInfo};
use serde_json::json;

use crate::args::SchedulesCommand;
use crate::table::Table;
use crate::{clock, Failure, Report};

/// Runs one `keiro schedules` command.
pub(crate) async fn run(
    keiro: &Keiro,
    action: Option<SchedulesCommand>,
) -> Result<Report, Failure> {
    match action {
        None => list(keiro).await,
        Some(SchedulesCommand::Pause { name }) => {
            keiro.pause_schedule(&name).await?;
            Ok(done(&name, "paused"))
        }
        Some(SchedulesCommand::Resume { name }) => {
            keiro.resume_schedule(&name).await?;
            Ok(done(&name, "resumed"))
        }
        Some(SchedulesCommand::Trigger { name }) => {
            let id = keiro.trigger_schedule(&name).await?;
            Ok(Report {
                human: format!("schedule {name} triggered: instance {id}\n"),
                json: json!({ "schedule": name, "id": id }),
            })
        }
    }
}

async fn list(keiro: &Keiro) -> Result<Report, Failure> {
    let schedules = keiro.schedules().await?;
    let mut table = Table::new(&[
        "NAME",
        "WORKFLOW",
        "CRON",
        "TIMEZONE",
        "STATE",
        "NEXT TICK",
        "LAST TICK",
    ]);
    for s in &schedules {
        table.row(vec![
            s.name.clone(),
            s.workflow.clone(),
            s.cron.clone(),
            s.timezone.clone(),
            match (&s.problem, s.paused) {
                (Some(_), _) => "broken",
                (None, true) => "paused",
                (None, false) => "active",
            }
            .to_owned(),
            s.next_tick.map(clock::short).unwrap_or_default(),
            s.last_tick.map(clock::short).unwrap_or_default(),
        ]);
    }
    // What is wrong with a broken one, under the table.
    let mut human = table.render();
    for s in &schedules {
        if let Some(problem) = &s.problem {
            human.push_str(&format!("schedule {} is broken: {problem}\n", s.name));
        }
    }
    Ok(Report {
        human,
        json: json!(schedules.iter().map(schedule_json).collect::<Vec<_>>()),
    })
}

fn schedule_json(s: &ScheduleInfo) -> serde_json::Value {
    let time = |t: Option<std::time::SystemTime>| t.map(keiro::admin::json::rfc3339);
    json!({
        "name": s.name,
        "workflow": s.workflow,
        "cron": s.cron,
        "timezone": s.timezone,
        "paused": s.paused,
        "dynamic": s.dynamic,
        "next_tick": time(s.next_tick),
        "last_tick": time(s.last_tick),
        "problem": s.problem,
    })
}

fn done(name: &str, what: &str) -> Report {
    Report {
        human: format!("schedule {name} {what}\n"),
        json: json!({ "schedule": name, "state": what }),
    }
}
