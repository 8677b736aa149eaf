//! Workflows of the executor identity and shutdown tests: work that holds its
//! lease for as long as the test needs, in one process or across several.

use std::time::Duration;

use keiro::{step, workflow};

/// The first time it runs for `marker` (a file path), creates the file and
/// holds for ten minutes (a long-running step, stopped only by a shutdown or
/// a kill); any later run returns at once. Returns the id of the process
/// that completed it.
#[step]
pub async fn hold_first_run(marker: String) -> u32 {
    if std::fs::metadata(&marker).is_err() {
        std::fs::write(&marker, std::process::id().to_string())
            .unwrap_or_else(|e| panic!("write marker {marker}: {e}"));
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    std::process::id()
}

/// One [`hold_first_run`] step; returns the process that completed it.
#[workflow]
pub async fn held(marker: String) -> u32 {
    hold_first_run(marker).await
}

/// Waits until `path` exists (up to 30 s); panics naming it otherwise.
pub async fn wait_for_file(path: &std::path::Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(path).is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} was not created within 30 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `millis` and returns the id of the process that ran it.
#[step]
pub async fn take_time(millis: u64) -> u32 {
    tokio::time::sleep(Duration::from_millis(millis)).await;
    std::process::id()
}

/// One [`take_time`] step: a short run in flight.
#[workflow]
pub async fn brief(millis: u64) -> u32 {
    take_time(millis).await
}
