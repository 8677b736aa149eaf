// Each workflow holds one mistake in its schedule; each is refused at the
// user's tokens, saying how to fix it.
use std::time::SystemTime;

const EVERY_NIGHT: &str = "0 0 2 * * *";

// A timezone with no schedule to apply it to.
#[keiro::workflow(timezone = "Europe/Berlin")]
async fn zoned(day: u64) -> Result<(), String> {
    let _ = day;
    Ok(())
}

// The expression must be a literal, so it can be checked here.
#[keiro::workflow(cron = EVERY_NIGHT)]
async fn from_a_constant(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

// 30 February never comes.
#[keiro::workflow(cron = "0 0 2 30 2 *")]
async fn never(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

// Nor does it in any year.
#[keiro::workflow(cron = "0 0 2 30 2 * *")]
async fn never_in_any_year(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

// The tick is the one argument.
#[keiro::workflow(cron = "0 0 2 * * *")]
async fn no_tick() -> Result<(), String> {
    Ok(())
}

#[keiro::workflow(cron = "0 0 2 * * *")]
async fn two_arguments(scheduled_at: SystemTime, region: String) -> Result<(), String> {
    let _ = (scheduled_at, region);
    Ok(())
}

// The name is the schedule's, part of its ticks' ids.
#[keiro::workflow(name = "report:trigger", cron = "0 0 2 * * *")]
async fn colon(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

fn main() {}
