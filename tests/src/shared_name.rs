//! The driver of the `shared_name_a` and `shared_name_b` child processes: two
//! binaries that each register a workflow named `shared_greeting`, with
//! different argument types.
//!
//! ```text
//! shared_name_x enqueue <id>   enqueue this binary's `shared_greeting` under <id>
//! shared_name_x pass           one resume pass; prints each event, then DONE <summary>
//! shared_name_x resume <id>    run the resume worker until <id> ends; DONE <output>
//! ```
//! The database is `KEIRO_DATABASE_URL`; the identity `KEIRO_EXECUTOR_ID`.

use std::time::Duration;

use keiro::{ResumeEvent, ResumeOptions};

/// The name both binaries register.
pub const SHARED_NAME: &str = "shared_greeting";

/// Runs the command line's mode; `enqueue` enqueues this binary's workflow
/// under the given id.
pub async fn drive<F, Fut>(enqueue: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), keiro::Error>>,
{
    if let Err(error) = run(enqueue).await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

async fn run<F, Fut>(enqueue: F) -> Result<(), keiro::Error>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), keiro::Error>>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    let keiro = keiro::global().await?;
    let options = |log: fn(&ResumeEvent)| {
        ResumeOptions::default()
            .poll_interval(Duration::from_millis(50))
            .log(log)
    };
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["enqueue", id] => {
            enqueue(id.to_string()).await?;
            println!("DONE null");
        }
        ["pass"] => {
            let summary = keiro.resume_once(&options(print_event)).await?;
            println!(
                "DONE {}",
                serde_json::json!({
                    "discovered": summary.discovered,
                    "resumed": summary.resumed,
                    "unknown_name": summary.unknown_name,
                    "failed": summary.failed,
                })
            );
        }
        ["resume", id] => {
            let worker = keiro.resume_worker(options(|_| {})).await?;
            let out: serde_json::Value = keiro.handle(*id).await?.result().await?;
            worker.shutdown().await;
            println!("DONE {out}");
        }
        other => {
            eprintln!("usage: enqueue <id> | pass | resume <id> (got {other:?})");
            std::process::exit(2);
        }
    }
    Ok(())
}

/// One line per event a pass reports about an instance.
fn print_event(event: &ResumeEvent) {
    match event {
        ResumeEvent::SignatureMismatch {
            name,
            id,
            stored,
            registered,
        } => println!("EVENT SignatureMismatch {name} {id} {stored} {registered}"),
        ResumeEvent::UnknownName { name, id } => println!("EVENT UnknownName {name} {id}"),
        ResumeEvent::Crashed { name, id, error } => println!("EVENT Crashed {name} {id} {error}"),
        _ => {}
    }
}
