//! Durable timers: a process manager schedules reminders, a worker fires them,
//! and what could not be fired waits in the dead-letter pages.
//!
//! ```text
//! cargo run -p keiro-examples --example timer_worker
//! ```
//!
//! With no `KEIRO_DATABASE_URL` the timers live in `keiro.db` in the working
//! directory (created if missing); each run schedules a fresh set.

use std::time::{Duration, Instant};

use keiro::timers::{
    FireOutcome, TimerId, TimerPageRequest, TimerRequest, TimerRow, TimerStatus, TimerWorkerOptions,
};
use serde::{Deserialize, Serialize};

/// What a reminder timer carries.
#[derive(Debug, Serialize, Deserialize)]
struct Reminder {
    email: Option<String>,
    text: String,
}

/// The fire action: what the "reminders" process manager does when one of its
/// timers is due. It must be idempotent: a timer whose worker dies mid-fire
/// fires again.
async fn fire(timer: TimerRow) -> FireOutcome {
    if timer.process_manager != "reminders" {
        return FireOutcome::NotMine;
    }
    let reminder: Reminder = match timer.payload_as() {
        Ok(reminder) => reminder,
        Err(error) => return FireOutcome::failed_permanently(error.to_string()),
    };
    let Some(email) = reminder.email else {
        println!("  {}: no email address, dead-lettering", timer.id);
        return FireOutcome::failed_permanently("the reminder has no email address");
    };
    if reminder.text.contains("flaky") && timer.attempts == 1 {
        println!("  {} (attempt 1): mail server busy, retrying", timer.id);
        return FireOutcome::retry_later(Duration::from_millis(300), "mail server busy");
    }
    println!(
        "  {} (attempt {}): mailed {email}: {}",
        timer.id, timer.attempts, reminder.text
    );
    FireOutcome::completed(format!("mail-{}", timer.id))
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let keiro = keiro::global().await?;
    let timers = keiro.timers();

    // A fresh set of ids per run; scheduling is idempotent on the id.
    let run = keiro::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let id = |name: &str| TimerId::new(format!("{run}/{name}"));
    let reminder = |name: &str, after_ms: u64, email: Option<&str>, text: &str| {
        TimerRequest::after(
            id(name),
            "reminders",
            format!("user-{run}"),
            Duration::from_millis(after_ms),
        )
        .payload(
            serde_json::to_value(Reminder {
                email: email.map(str::to_owned),
                text: text.to_owned(),
            })
            .expect("a reminder is JSON"),
        )
    };

    let welcome = reminder("welcome", 200, Some("ada@example.com"), "welcome aboard");
    timers.schedule(&welcome).await?;
    let again = timers.schedule_once(&welcome).await?;
    println!(
        "scheduled {} (a second schedule_once created another: {again})",
        welcome.id
    );
    for request in [
        reminder("flaky", 0, Some("bob@example.com"), "a flaky delivery"),
        reminder("broken", 0, None, "nobody to tell"),
        reminder("cancelled", 1_000, Some("eve@example.com"), "never sent"),
    ] {
        timers.schedule(&request).await?;
        println!("scheduled {}", request.id);
    }
    timers.cancel(&id("cancelled")).await?;
    println!("cancelled {}", id("cancelled"));

    println!("timer worker running:");
    let worker = timers.spawn_worker(
        TimerWorkerOptions::default()
            .max_attempts(5)
            .poll_interval(Duration::from_millis(100)),
        fire,
    )?;

    // Wait until every live timer of this run is fired or dead.
    let started = Instant::now();
    for name in ["welcome", "flaky", "broken"] {
        loop {
            let timer = timers.get(&id(name)).await?.expect("scheduled above");
            if matches!(timer.status, TimerStatus::Fired | TimerStatus::Dead) {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                eprintln!("{} is still {} after 30 s", timer.id, timer.status);
                std::process::exit(1);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    worker.shutdown().await;

    println!("this run's timers:");
    for name in ["welcome", "flaky", "broken", "cancelled"] {
        let timer = timers.get(&id(name)).await?.expect("scheduled above");
        println!(
            "  {:<18} {:<9} attempts={} event={} last_error={}",
            timer.id.as_str(),
            timer.status.as_str(),
            timer.attempts,
            timer.event_id.as_deref().unwrap_or("-"),
            timer.last_error.as_deref().unwrap_or("-"),
        );
    }
    let dead = timers.dead(&TimerPageRequest::first(20)).await?;
    println!(
        "dead letters in this database: {}{}",
        dead.items.len(),
        if dead.next_cursor.is_some() { "+" } else { "" }
    );
    Ok(())
}
