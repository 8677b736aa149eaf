use std::time::SystemTime;

// Five fields: keiro's cron expressions start with seconds.
#[keiro::workflow(cron = "0 2 * * *")]
async fn nightly_report(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

fn main() {}
