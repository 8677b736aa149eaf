//! The child process of the timer crash test: a timer worker loop that fires
//! every due timer.
//!
//! ```text
//! timer_worker <effects-file>
//! ```
//! The database is `KEIRO_DATABASE_URL`; claims older than `TIMER_TTL_MS` are
//! requeued. Each fire appends `<id> <attempt>` to the effects file and
//! prints `FIRING <id> <attempt>`; with `TIMER_BLOCK=1` the fire action then
//! blocks forever (the test SIGKILLs the process there), else it completes
//! and prints `FIRED <id> <attempt>`. With `TIMER_DRAIN=1` the loop is the
//! application's own, calling `Timers::drain` every 50 ms, and prints
//! `REFUSED <error>` when a call fails after one that did not. keiro's own
//! log (`info`) goes to stdout too.

use std::io::Write;
use std::time::Duration;

use keiro::timers::{FireOutcome, TimerRow, TimerWorkerOptions, Timers};

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), keiro::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [effects] = args.as_slice() else {
        eprintln!("usage: timer_worker <effects-file> (got {args:?})");
        std::process::exit(2);
    };
    let url = std::env::var("KEIRO_DATABASE_URL").expect("KEIRO_DATABASE_URL");
    let ttl: u64 = std::env::var("TIMER_TTL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let block = std::env::var("TIMER_BLOCK").is_ok_and(|v| v == "1");
    let effects = effects.clone();
    tracing_subscriber::fmt()
        .with_env_filter("keiro=info")
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();

    let timers = Timers::connect(&url).await?;
    let options = TimerWorkerOptions::default()
        .max_attempts(None)
        .requeue_stuck_after(Duration::from_millis(ttl))
        .poll_interval(Duration::from_millis(50));
    let fire = move |timer: TimerRow| {
        let effects = effects.clone();
        async move {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&effects)
                .expect("open the effects file");
            writeln!(file, "{} {}", timer.id, timer.attempts).expect("record the effect");
            file.sync_all().expect("sync the effects file");
            say(&format!("FIRING {} {}", timer.id, timer.attempts));
            if block {
                std::future::pending::<()>().await;
            }
            say(&format!("FIRED {} {}", timer.id, timer.attempts));
            FireOutcome::completed(format!("ev-{}-{}", timer.id, timer.attempts))
        }
    };
    if std::env::var("TIMER_DRAIN").is_ok_and(|v| v == "1") {
        say("READY");
        let mut refused = false;
        loop {
            match timers.drain(&options, 10, &fire).await {
                Ok(_) => refused = false,
                Err(error) if !refused => {
                    say(&format!("REFUSED {error}"));
                    refused = true;
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let worker = timers.spawn_worker(options, fire)?;
    say("READY");
    tokio::signal::ctrl_c().await.ok();
    worker.shutdown().await;
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("write stdout");
    out.flush().expect("flush stdout");
}
