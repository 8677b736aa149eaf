use std::time::Duration;

use keiro::{step, workflow};
use tokio::time;

#[step]
async fn poll(job: String) -> bool {
    !job.is_empty()
}

// Waits outside the journal, in both spellings: the full path and the
// module after `use tokio::time`.
#[workflow]
async fn wait_for_job(job: String) -> bool {
    while !poll(job.clone()).await {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    time::sleep(Duration::from_secs(1)).await;
    true
}

fn main() {}
