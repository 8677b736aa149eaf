use std::time::{Duration, SystemTime};

use keiro::{step, workflow};

#[step]
async fn remind(who: String) {
    drop(who);
}

// The clock answers differently on replay, so the branch can change.
#[workflow]
async fn nudge(who: String, due: SystemTime) {
    if SystemTime::now() > due + Duration::from_secs(60) {
        remind(who).await;
    }
}

fn main() {}
