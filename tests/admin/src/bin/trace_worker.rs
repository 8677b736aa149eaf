//! Process B of the trace test: a resume worker that runs one enqueued
//! workflow instance to its end, exporting its spans through OpenTelemetry.
//!
//! ```text
//! trace_worker <spans-file> <instance-id>
//! ```
//! The database is `KEIRO_DATABASE_URL`. Every span that ends is appended to
//! the spans file as a JSON line ([`keiro_admin_tests::otel::ExportedSpan`]);
//! once the instance is final the worker stops and prints `DONE <status>`.

use std::time::Duration;

use keiro::{Keiro, ResumeOptions};
use keiro_admin_tests::otel::{install, SpanSink};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [spans, id] = args.as_slice() else {
        eprintln!("usage: trace_worker <spans-file> <instance-id> (got {args:?})");
        std::process::exit(2);
    };
    let provider = install(SpanSink::File(spans.into()));
    let url = std::env::var("KEIRO_DATABASE_URL").expect("KEIRO_DATABASE_URL");
    let status = run(&url, id).await.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        std::process::exit(1);
    });
    provider.shutdown().expect("flush the spans");
    println!("DONE {status}");
}

async fn run(url: &str, id: &str) -> keiro::Result<String> {
    let keiro = Keiro::connect(url).await?;
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await?;
    let handle = keiro.handle::<String>(id).await?;
    handle.result().await?;
    let status = handle.status().await?;
    worker.shutdown().await;
    keiro.shutdown().await?;
    Ok(format!("{status:?}"))
}
