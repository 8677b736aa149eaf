#[keiro::workflow(cron = "0 0 2 * * *")]
async fn nightly_report(day: u64) -> Result<(), String> {
    let _ = day;
    Ok(())
}

fn main() {}
