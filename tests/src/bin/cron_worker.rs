//! The child process of the cron test: a resume worker (and so a cron
//! scheduler) on `KEIRO_DATABASE_URL`, serving `cron_tick`, a schedule
//! ticking every second.
//!
//! ```text
//! cron_worker <effects-file>
//! cron_worker --trigger | --pause
//! ```
//! Each run of a tick appends `<tick, seconds since the Unix epoch> <pid>`
//! to the effects file. With `--trigger` or `--pause` it runs no worker: it
//! triggers or pauses `cron_tick` (writing its row first if the table lacks
//! it, as any process linking it does), prints `triggered` or `paused`, and
//! exits.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where `record` appends (the first argument).
static EFFECTS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[keiro::workflow(cron = "*/1 * * * * *")]
async fn cron_tick(scheduled_at: SystemTime) -> Result<(), String> {
    let secs = scheduled_at
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    record(secs).await
}

#[keiro::step]
async fn record(tick: u64) -> Result<(), String> {
    let path = EFFECTS.get().ok_or("no effects file")?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    writeln!(file, "{tick} {}", std::process::id()).map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [manage] = args.as_slice() {
        if manage == "--trigger" || manage == "--pause" {
            let keiro = keiro::global().await.expect("open the database");
            if manage == "--trigger" {
                keiro.trigger_schedule("cron_tick").await.expect("trigger");
                println!("triggered");
            } else {
                keiro.pause_schedule("cron_tick").await.expect("pause");
                println!("paused");
            }
            return;
        }
    }
    let [effects] = args.as_slice() else {
        eprintln!("usage: cron_worker <effects-file> | --trigger | --pause (got {args:?})");
        std::process::exit(2);
    };
    EFFECTS.set(effects.clone()).expect("set once");
    keiro_tests::process::serve_until_killed().await;
}
