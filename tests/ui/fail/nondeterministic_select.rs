use std::time::Duration;

use keiro::{step, workflow};

#[step]
async fn charge(cents: u64) -> u64 {
    cents
}

// Which branch wins depends on timing, so a replay can take the other one.
#[workflow]
async fn pay(cents: u64) -> Option<u64> {
    tokio::select! {
        charged = charge(cents) => Some(charged),
        _ = keiro::sleep(Duration::from_secs(30)) => None,
    }
}

fn main() {}
