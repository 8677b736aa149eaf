// The macro sees the argument's type by name only: another `SystemTime` is
// refused by type.
mod clock {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct SystemTime(pub u64);
}

#[keiro::workflow(cron = "0 0 2 * * *")]
async fn nightly_report(scheduled_at: clock::SystemTime) -> Result<(), String> {
    let _ = scheduled_at.0;
    Ok(())
}

fn main() {}
