use std::time::Duration;

use keiro::workflow;

// Blocks the worker's thread and is not durable.
#[workflow]
async fn pause(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn main() {}
