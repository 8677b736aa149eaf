use std::time::SystemTime;

// Hour 25 does not exist.
#[keiro::workflow(cron = "0 0 25 * * *")]
async fn nightly_report(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

fn main() {}
