//! Cron schedules: a declared one ticking every two seconds, a nightly one
//! in Berlin time, a schedule made at run time, and the operator's calls
//! (list, trigger, pause).
//!
//! ```text
//! cargo run -p keiro-examples --example cron
//! ```
//!
//! Start it twice at once on one database (`KEIRO_DATABASE_URL`) and each
//! tick still runs once: its instance id is derived from the schedule and
//! the tick time.

use std::time::{Duration, SystemTime};

use keiro::{step, workflow, Error, ResumeOptions};

/// Prints the tick it runs for.
#[step]
async fn report(what: String, scheduled_at: SystemTime) -> Result<(), String> {
    let at = humantime_ish(scheduled_at);
    println!("  {what} for the tick at {at}");
    Ok(())
}

/// Every two seconds (the seconds field comes first).
#[workflow(cron = "*/2 * * * * *")]
async fn heartbeat(scheduled_at: SystemTime) -> Result<(), String> {
    report("heartbeat".into(), scheduled_at).await
}

/// Every night at 02:00 in Berlin, daylight saving included.
#[workflow(cron = "0 0 2 * * *", timezone = "Europe/Berlin")]
async fn nightly_report(scheduled_at: SystemTime) -> Result<(), String> {
    report("nightly report".into(), scheduled_at).await
}

/// Started by a schedule made at run time, with the arguments given then.
#[workflow]
async fn cleanup(table: String) -> Result<(), String> {
    let now = keiro::now().await;
    report(format!("cleanup of {table}"), now).await
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let keiro = keiro::global().await?;
    keiro
        .create_schedule(
            "cleanup-sessions",
            "*/3 * * * * *",
            cleanup("sessions".into()),
        )
        .await?;
    // The scheduler runs beside the resume worker.
    let worker = keiro.resume_worker(ResumeOptions::default()).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let id = keiro.trigger_schedule("nightly_report").await?;
    println!("triggered the nightly report now: {id}");
    keiro.pause_schedule("heartbeat").await?;
    println!("paused heartbeat");
    tokio::time::sleep(Duration::from_secs(2)).await;
    for schedule in keiro.schedules().await? {
        println!(
            "{:<18} {:<16} {:<14} paused={:<5} next={}",
            schedule.name,
            schedule.cron,
            schedule.timezone,
            schedule.paused,
            schedule
                .next_tick
                .map(humantime_ish)
                .unwrap_or_else(|| "-".into())
        );
    }
    // Leave the database as we found it for the next run.
    keiro.resume_schedule("heartbeat").await?;
    keiro.delete_schedule("cleanup-sessions").await?;
    worker.shutdown().await;
    Ok(())
}

/// Seconds since the Unix epoch, enough to tell ticks apart.
fn humantime_ish(at: SystemTime) -> String {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => format!("{}s", d.as_secs()),
        Err(_) => "before 1970".into(),
    }
}
