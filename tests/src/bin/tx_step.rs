//! The child process of the transactional-step crash test.
//!
//! ```text
//! tx_step pay <id> <entry> [pause]  run pay(<id>, <entry>, 10) under <id>; with
//!                                   `pause`, the debit prints INSERTED and waits
//!                                   forever after its writes, before its commit
//! tx_step resume <id>               start the resume worker, wait for <id>, print DONE
//! ```
//! The database is `KEIRO_DATABASE_URL`; the identity `KEIRO_EXECUTOR_ID`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use keiro::ResumeOptions;
use keiro_tests::transactional::{pay, BankError, PAUSE_AFTER_INSERT};

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), keiro::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out: Result<i64, BankError> = match args.as_slice() {
        ["pay", id, entry, rest @ ..] => {
            PAUSE_AFTER_INSERT.store(rest == ["pause"], Ordering::SeqCst);
            pay(id.to_string(), entry.to_string(), 10).id(*id).await?
        }
        ["resume", id] => {
            let keiro = keiro::global().await?;
            let options = ResumeOptions::default().poll_interval(Duration::from_millis(50));
            let worker = keiro.resume_worker(options).await?;
            let out = keiro.handle(*id).await?.result().await?;
            worker.shutdown().await;
            out
        }
        other => panic!("unknown arguments {other:?}"),
    };
    println!("DONE {}", serde_json::to_string(&out).expect("encode"));
    Ok(())
}
