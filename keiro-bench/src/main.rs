//! keiro's benchmark.
//!
//! ```text
//! cargo run --release -p keiro-bench -- --backend sqlite|postgres \
//!     [--workload NAME] [--sqlite-synchronous full|normal]
//! ```
//!
//! Prints one JSON line per figure:
//! `{"system":"keiro","backend":"sqlite","workload":"raw_commit_1","value":N,"unit":"us/commit",...}`
//! (SQLite figures add `"sync"`; some add what they measured). Without
//! `--workload` it runs every workload of the backend. PostgreSQL databases
//! are created on `KEIRO_BENCH_POSTGRES_URL` (default `postgres:///keiro_test`)
//! as `keiro_b_<uuid>`, one per workload, and dropped afterwards; SQLite uses
//! a fresh file in a temporary directory per workload.
//!
//! The binary re-executes itself (`keiro-bench __child ...`) for the
//! workloads that need other processes: crash recovery, awakeables resolved
//! elsewhere, the suspended-scale worker and multi-process workers.

mod common;
mod cron;
mod listing;
mod messages;
mod pooler;
mod queues;
mod raw;
mod recovery;
mod retention;
mod select;
mod sleeps;
mod suspended;
mod throughput;
mod transactional;
mod wake;
mod workers;
mod workflows;

use std::process::ExitCode;
use std::time::Instant;

use keiro::SqliteSynchronous;

use crate::common::{fail, parse_sync, Backend, BenchResult, Config};

/// Every workload, in the order a full run takes them.
const WORKLOADS: [&str; 20] = [
    "raw_commit_1",
    "raw_commit_16",
    "seq_0steps",
    "seq_10steps",
    "seq_10steps_pipelined",
    "concurrent_3steps",
    "select_overhead",
    "sleep_10x100ms",
    "recovery",
    "wake_latency",
    "suspended_1m",
    "workers_1_2_4",
    "message_latency",
    "message_throughput",
    "list_page",
    "gc_rate",
    "transactional_step",
    "cron_lag",
    "queue_throughput",
    // Last: it switches the process to unnamed statements (see pooler.rs).
    "pgbouncer",
];

const USAGE: &str = "usage: keiro-bench --backend sqlite|postgres [--workload NAME] \
                     [--sqlite-synchronous full|normal]";

fn main() -> ExitCode {
    // The first instruction: `recovery` measures its fresh process from here.
    let started = Instant::now();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("keiro-bench: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("__child") {
        runtime.block_on(child(started, &args[1..]))
    } else {
        runtime.block_on(bench(&args))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keiro-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line and runs the chosen workloads.
async fn bench(args: &[String]) -> BenchResult {
    let mut backend = None;
    let mut workload = None;
    let mut sync = SqliteSynchronous::Full;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_owned())),
            None => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| rest.next().cloned())
                .ok_or_else(|| fail(format!("{flag} needs a value\n{USAGE}")))
        };
        match flag {
            "--backend" => {
                let v = value()?;
                backend = Some(
                    Backend::parse(&v)
                        .ok_or_else(|| fail(format!("unknown backend `{v}`\n{USAGE}")))?,
                );
            }
            "--workload" => {
                let v = value()?;
                if !WORKLOADS.contains(&v.as_str()) {
                    return Err(fail(format!(
                        "unknown workload `{v}`; one of: {}",
                        WORKLOADS.join(", ")
                    )));
                }
                workload = Some(v);
            }
            "--sqlite-synchronous" => {
                let v = value()?;
                sync = parse_sync(&v)
                    .ok_or_else(|| fail(format!("`{v}` is not full or normal\n{USAGE}")))?;
            }
            "-h" | "--help" => {
                println!("{USAGE}\nworkloads: {}", WORKLOADS.join(", "));
                return Ok(());
            }
            other => return Err(fail(format!("unexpected argument `{other}`\n{USAGE}"))),
        }
    }
    let backend = backend.ok_or_else(|| fail(USAGE))?;
    let cfg = Config { backend, sync };
    let chosen: Vec<&str> = match &workload {
        Some(w) => {
            if (w == "workers_1_2_4" || w == "pgbouncer") && backend != Backend::Postgres {
                return Err(fail(format!("{w} runs on PostgreSQL only")));
            }
            vec![w.as_str()]
        }
        None => WORKLOADS
            .iter()
            .copied()
            .filter(|w| {
                !matches!(*w, "workers_1_2_4" | "pgbouncer") || backend == Backend::Postgres
            })
            .collect(),
    };

    let mut failed = Vec::new();
    let mut seq_done = false;
    for name in chosen {
        let started = Instant::now();
        let result = match name {
            "raw_commit_1" => raw::raw_commit_1(&cfg).await,
            "raw_commit_16" => raw::raw_commit_16(&cfg).await,
            // A full run measures both series once and prints all their figures.
            "seq_0steps" | "seq_10steps" if workload.is_none() => {
                if seq_done {
                    continue;
                }
                seq_done = true;
                throughput::sequential(&cfg, true, true).await
            }
            "seq_0steps" => throughput::sequential(&cfg, true, false).await,
            "seq_10steps" => throughput::sequential(&cfg, false, true).await,
            "seq_10steps_pipelined" => throughput::sequential_pipelined(&cfg).await,
            "concurrent_3steps" => throughput::concurrent(&cfg).await,
            "select_overhead" => select::select_overhead(&cfg).await,
            "sleep_10x100ms" => sleeps::sleep_10x100ms(&cfg).await,
            "recovery" => recovery::recovery(&cfg).await,
            "wake_latency" => wake::wake_latency(&cfg).await,
            "suspended_1m" => suspended::suspended_1m(&cfg).await,
            "workers_1_2_4" => workers::workers_1_2_4(&cfg).await,
            "message_latency" => messages::message_latency(&cfg).await,
            "message_throughput" => messages::message_throughput(&cfg).await,
            "list_page" => listing::list_page(&cfg).await,
            "gc_rate" => retention::gc_rate(&cfg).await,
            "transactional_step" => transactional::transactional_step(&cfg).await,
            "cron_lag" => cron::cron_lag(&cfg).await,
            "queue_throughput" => queues::queue_throughput(&cfg).await,
            "pgbouncer" => pooler::pgbouncer(&cfg).await,
            other => Err(fail(format!("unknown workload {other}"))),
        };
        eprintln!(
            "keiro-bench: {name} took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if let Err(e) = result {
            eprintln!("keiro-bench: workload {name} failed: {e}");
            failed.push(name);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(fail(format!("failed workloads: {}", failed.join(", "))))
    }
}

/// The hidden subcommands this binary runs as a child of itself.
async fn child(started: Instant, args: &[String]) -> BenchResult {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let sync = |s: &str| parse_sync(s).ok_or_else(|| fail(format!("bad sync `{s}`")));
    match args.as_slice() {
        ["recovery-run", url, s, executor, id, file] => {
            recovery::child_run(url, sync(s)?, executor, id, file).await
        }
        ["recovery-resume", url, s, executor, id] => {
            recovery::child_resume(started, url, sync(s)?, executor, id).await
        }
        ["resolver", url, s] => wake::child_resolver(url, sync(s)?).await,
        ["suspended-pass", url, s, due_at] => {
            let due_at = due_at
                .parse()
                .map_err(|_| fail(format!("bad due time `{due_at}`")))?;
            suspended::child_pass(url, sync(s)?, due_at).await
        }
        ["worker", url, executor] => workers::child_worker(url, executor).await,
        ["message-sender", url, s] => messages::child_sender(url, sync(s)?).await,
        other => Err(fail(format!("unknown child command {other:?}"))),
    }
}
