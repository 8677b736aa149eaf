use std::time::SystemTime;

// Meant as Monday to Friday; this cron counts 1 = Sunday.
#[keiro::workflow(cron = "0 0 9 * * 1-5")]
async fn weekday_report(scheduled_at: SystemTime) -> Result<(), String> {
    let _ = scheduled_at;
    Ok(())
}

fn main() {}
