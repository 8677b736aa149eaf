//! Crash recovery: the first run crashes itself (`abort()`, a real process
//! death) in the middle of a four-step workflow; the second run's resume
//! worker picks it up and finishes it, replaying the steps journaled before
//! the crash instead of running them again.
//!
//! ```text
//! cargo run -p keiro-examples --example crash_recovery   # runs steps 1-2, then crashes
//! cargo run -p keiro-examples --example crash_recovery   # replays 1-2, runs 3-4, completes
//! ```

use std::sync::Mutex;
use std::time::Duration;

use keiro::{step, workflow, ResumeOptions};

const ID: &str = "fulfil-7";
/// Present once the first run has crashed, so the replay does not crash again.
const MARKER: &str = "crash_recovery.crashed";

/// The step bodies that ran in this process.
static RAN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

fn running(step: &'static str) {
    RAN.lock().unwrap().push(step);
    println!("  running step `{step}`");
}

#[step]
async fn reserve(order: u32) -> String {
    running("reserve");
    format!("hold-{order}")
}

#[step]
async fn charge(order: u32) -> String {
    running("charge");
    format!("payment-{order}")
}

#[step]
async fn pack(hold: String) -> String {
    running("pack");
    format!("parcel({hold})")
}

#[step]
async fn ship(parcel: String) -> String {
    running("ship");
    format!("tracking for {parcel}")
}

#[workflow]
async fn fulfil(order: u32) -> String {
    let hold = reserve(order).await;
    let payment = charge(order).await;
    if !std::path::Path::new(MARKER).exists() {
        std::fs::write(MARKER, "").expect("write the crash marker");
        println!("  crashing now (abort), after `reserve` and `charge` were journaled");
        std::process::abort();
    }
    let parcel = pack(hold).await;
    let tracking = ship(parcel).await;
    format!("{tracking}, paid by {payment}")
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let keiro = keiro::global().await?;
    match keiro.handle::<String>(ID).await {
        Err(keiro::Error::NotFound { .. }) => {
            println!("first run: starting workflow {ID}");
            let out = fulfil(7).id(ID).await?;
            println!("finished without crashing: {out}");
        }
        Err(other) => return Err(other),
        Ok(handle) if handle.status().await?.is_final() => {
            println!("{ID} has finished already: {}", handle.result().await?);
            println!("(delete keiro.db and {MARKER} to start over)");
        }
        Ok(handle) => {
            println!("second run: the resume worker picks up {ID}");
            let worker = keiro
                .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(100)))
                .await?;
            let out = handle.result().await?;
            worker.shutdown().await;
            let ran = RAN.lock().unwrap().clone();
            for step in ["reserve", "charge", "pack", "ship"] {
                let how = if ran.contains(&step) {
                    "ran now"
                } else {
                    "replayed from the journal"
                };
                println!("  step `{step}`: {how}");
            }
            println!("result: {out}");
        }
    }
    Ok(())
}
