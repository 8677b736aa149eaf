//! Debouncing: fifty edits of one profile over 200 ms start one sync, half a
//! second after the last edit, with the last edit's fields.
//!
//! ```text
//! cargo run -p keiro-examples --example debounce
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro::{workflow, Error, ResumeOptions};

/// Pushes a profile's fields to the search index (here: prints them).
#[workflow]
async fn sync_profile(user: u64, fields: Vec<String>) -> Result<String, String> {
    println!(
        "  syncing user {user}: {} fields, the last {:?}",
        fields.len(),
        fields.last()
    );
    Ok(format!("user {user} synced with {} fields", fields.len()))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let keiro = keiro::global().await?;
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(20)))
        .await?;
    // A key of its own per run, so the example can run again at once.
    let user = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut handles = Vec::new();
    // One edit every 4 ms.
    let burst = tokio::time::Instant::now();
    for edit in 1..=50 {
        tokio::time::sleep_until(burst + Duration::from_millis(4) * (edit - 1)).await;
        let fields: Vec<String> = (1..=edit).map(|n| format!("field-{n}")).collect();
        let handle = sync_profile(user, fields)
            .debounce(user.to_string(), Duration::from_millis(500))
            .max_wait(Duration::from_secs(10))
            .enqueue()
            .await?;
        handles.push(handle);
    }
    let first = handles[0].id().to_owned();
    assert!(
        handles.iter().all(|h| h.id() == first),
        "one burst, one instance"
    );
    println!("50 calls, one instance: {first}");
    println!("{:?}", handles[49].result().await?);
    worker.shutdown().await;
    Ok(())
}
