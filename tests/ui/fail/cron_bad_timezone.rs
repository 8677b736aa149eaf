use std::time::SystemTime;

#[keiro::workflow(cron = "0 0 2 * * *", timezone = "Europe/Berlln")]
async fn nightly_report(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

fn main() {}
