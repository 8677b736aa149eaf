//! The child process of the crash and many-worker tests.
//!
//! ```text
//! crash_workflow run <id> <file>   run five_steps(file) under <id> in-process
//! crash_workflow approval <id> <file>  run approval_flow(file) under <id>
//! crash_workflow family <id> <file>    run family(file) under <id>
//! crash_workflow sleep <id> <ms>   run sleepy(ms) under <id> in-process
//! crash_workflow mailbox <id> <file> <ms>  run mailbox(file, ms) under <id>
//! crash_workflow deadline <id> <ms> <timeout ms>  run sleepy(ms) under <id> with a timeout
//! crash_workflow select <id> <file>   run select_race(file) under <id>
//! crash_workflow pipelined <id> <file> <steps> <pace ms>  run pipelined_steps under <id>
//! crash_workflow resume <id>       start the resume worker, wait for <id>, print DONE
//! crash_workflow worker            run the resume worker until killed
//! crash_workflow worker <poll ms>  the same, polling every <poll ms>
//! ```
//! The database is `KEIRO_DATABASE_URL` (and `KEIRO_LISTEN_URL`); the
//! identity `KEIRO_EXECUTOR_ID`.

use std::time::{Duration, Instant};

use keiro::ResumeOptions;
use keiro_tests::workflows::{
    approval_flow, family, five_steps, mailbox, pipelined_steps, select_race, sleepy,
};

#[tokio::main]
async fn main() {
    let started = Instant::now();
    if let Err(error) = run(started).await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

async fn run(started: Instant) -> Result<(), keiro::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["run", id, file] => {
            let out = five_steps(file.to_string()).id(*id).await?;
            println!("DONE {out}");
        }
        ["pipelined", id, file, steps, pace] => {
            let steps: u32 = steps
                .parse()
                .expect("pipelined <id> <file> <steps> <pace ms>");
            let pace: u64 = pace
                .parse()
                .expect("pipelined <id> <file> <steps> <pace ms>");
            let out = pipelined_steps(file.to_string(), steps, pace)
                .id(*id)
                .await?;
            println!("DONE {}", serde_json::to_string(&out).unwrap());
        }
        ["resume", id] => {
            let keiro = keiro::global().await?;
            let worker = keiro
                .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
                .await?;
            let out: serde_json::Value = keiro.handle(*id).await?.result().await?;
            let elapsed = started.elapsed();
            println!("DONE {out} {}", elapsed.as_micros());
            worker.shutdown().await;
        }
        ["approval", id, file] => {
            let out = approval_flow(file.to_string()).id(*id).await?;
            println!("DONE {}", serde_json::to_string(&out).unwrap());
        }
        ["family", id, file] => {
            let out = family(file.to_string()).id(*id).await?;
            println!("DONE {out}");
        }
        ["sleep", id, millis] => {
            let millis: u64 = millis.parse().expect("sleep <id> <millis>");
            let out = sleepy(millis).id(*id).await?;
            println!("DONE {}", serde_json::to_string(&out).unwrap());
        }
        ["mailbox", id, file, millis] => {
            let millis: u64 = millis.parse().expect("mailbox <id> <file> <millis>");
            let out = mailbox(file.to_string(), millis).id(*id).await?;
            println!("DONE {}", serde_json::to_string(&out).unwrap());
        }
        ["deadline", id, millis, timeout] => {
            let millis: u64 = millis.parse().expect("deadline <id> <millis> <timeout>");
            let timeout: u64 = timeout.parse().expect("deadline <id> <millis> <timeout>");
            let out = sleepy(millis)
                .id(*id)
                .timeout(Duration::from_millis(timeout))
                .await?;
            println!("DONE {}", serde_json::to_string(&out).unwrap());
        }
        ["select", id, file] => {
            let out = select_race(file.to_string()).id(*id).await?;
            println!("DONE {}", serde_json::to_string(&out).unwrap());
        }
        ["worker"] => {
            let worker = keiro::run_resume_worker().await?;
            println!("READY");
            tokio::signal::ctrl_c().await.ok();
            worker.shutdown().await;
        }
        ["worker", poll] => {
            let poll: u64 = poll.parse().expect("worker <poll ms>");
            let worker = keiro::global()
                .await?
                .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(poll)))
                .await?;
            println!("READY");
            tokio::signal::ctrl_c().await.ok();
            worker.shutdown().await;
        }
        other => {
            eprintln!(
                "usage: crash_workflow run <id> <file> | resume <id> | worker (got {other:?})"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}
