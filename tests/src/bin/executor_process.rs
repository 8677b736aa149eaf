//! The child process of the executor identity tests.
//!
//! ```text
//! executor_process worker <lease_ms>  run a resume worker claiming one instance at a
//!                                     time under leases of <lease_ms>, logging
//!                                     keiro's `info` to stdout; print
//!                                     `READY <executor id>`; run until killed
//! executor_process run <marker>       run held(marker) in-process; print
//!                                     `DONE <process id> <executor id>`
//! ```
//! The database is `KEIRO_DATABASE_URL`; the identity `KEIRO_EXECUTOR_ID`
//! when set, else the default one. An error ends the process with status 1
//! after `error: <message>` on stdout.

use std::time::Duration;

use keiro::ResumeOptions;
use keiro_tests::executors::held;

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        println!("error: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), keiro::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["worker", lease_ms] => {
            let lease_ms: u64 = lease_ms.parse().expect("worker <lease_ms>");
            tracing_subscriber::fmt()
                .with_env_filter("keiro=info")
                .with_writer(std::io::stdout)
                .with_ansi(false)
                .init();
            // One instance per pass and at a time, so that several workers
            // share a handful of instances instead of one taking them all.
            // The lease TTL is the runtime's; the identity comes from the
            // environment as for the default runtime.
            let url = std::env::var(keiro::DATABASE_URL_ENV).expect("KEIRO_DATABASE_URL");
            let keiro = keiro::Keiro::builder(url)
                .lease_ttl(Duration::from_millis(lease_ms))
                .connect()
                .await?;
            keiro::init(keiro.clone())?;
            let worker = keiro
                .resume_worker(
                    ResumeOptions::default()
                        .poll_interval(Duration::from_millis(50))
                        .concurrency(1)
                        .batch_size(1),
                )
                .await?;
            println!("READY {}", keiro.executor_id());
            tokio::signal::ctrl_c().await.ok();
            worker.shutdown().await;
        }
        ["run", marker] => {
            let keiro = keiro::global().await?;
            let pid = held(marker.to_string()).await?;
            println!("DONE {pid} {}", keiro.executor_id());
        }
        other => {
            eprintln!("usage: executor_process worker <lease_ms> | run <marker> (got {other:?})");
            std::process::exit(2);
        }
    }
    Ok(())
}
