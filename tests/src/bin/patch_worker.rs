//! The child process of the patch test: one workflow, `parcel`, deployed as
//! two versions of its code, chosen on the command line.
//!
//! ```text
//! patch_worker v1 <effects-file> <id>        start `id` under v1, exit once it is suspended
//! patch_worker v2 <effects-file> <fresh-id>  resume worker under v2; also enqueues `fresh-id`
//! ```
//! The database is `KEIRO_DATABASE_URL`. v1 is `prepare`, a durable sleep,
//! `finish(false)`; v2 adds `keiro::patched("courier")` and, on its new
//! branch, a `reserve_courier` step before the sleep, then `finish(express)`.
//! Each step body appends `<id> <step>` to the effects file. v1 prints
//! `SUSPENDED <id>` before exiting; v2 prints `READY`, then runs until killed.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowStatus};

/// Which version of the code this process is, and where step bodies log.
struct Deployment {
    version: u32,
    effects: String,
}

static DEPLOYMENT: OnceLock<Deployment> = OnceLock::new();

fn deployment() -> &'static Deployment {
    DEPLOYMENT.get().expect("main sets the deployment first")
}

/// Appends `<id> <what>` to the effects file, durably.
fn effect(id: &str, what: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&deployment().effects)
        .expect("open the effects file");
    writeln!(file, "{id} {what}").expect("record the effect");
    file.sync_all().expect("sync the effects file");
}

#[step]
async fn prepare(id: String) -> u32 {
    effect(&id, "prepare");
    1
}

#[step]
async fn reserve_courier(id: String) -> u32 {
    effect(&id, "reserve_courier");
    2
}

#[step]
async fn finish(id: String, express: bool) -> String {
    effect(&id, "finish");
    if express { "express" } else { "standard" }.to_owned()
}

#[workflow]
async fn parcel(id: String, nap_ms: u64) -> Result<String, String> {
    prepare(id.clone()).await;
    let express = if deployment().version >= 2 {
        keiro::patched("courier").await
    } else {
        false
    };
    if express {
        reserve_courier(id.clone()).await;
    }
    keiro::sleep(Duration::from_millis(nap_ms)).await;
    Ok(finish(id, express).await)
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), keiro::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [version, effects, id] = args.as_slice() else {
        eprintln!("usage: patch_worker v1|v2 <effects-file> <id> (got {args:?})");
        std::process::exit(2);
    };
    let version = match version.as_str() {
        "v1" => 1,
        "v2" => 2,
        other => {
            eprintln!("unknown version `{other}`; expected v1 or v2");
            std::process::exit(2);
        }
    };
    let effects = effects.clone();
    DEPLOYMENT
        .set(Deployment { version, effects })
        .unwrap_or_else(|_| unreachable!("set once"));
    let url = std::env::var("KEIRO_DATABASE_URL").expect("KEIRO_DATABASE_URL");
    let keiro = Keiro::builder(&url)
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await?;
    if version == 1 {
        // Long enough that this process is gone before it is due.
        let handle = parcel(id.clone(), 1_500).id(id).on(&keiro).start().await?;
        while handle.status().await? != WorkflowStatus::Suspended {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        say(&format!("SUSPENDED {id}"));
        return Ok(());
    }
    let _worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await?;
    parcel(id.clone(), 100).id(id).on(&keiro).enqueue().await?;
    say("READY");
    std::future::pending::<()>().await;
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("write stdout");
    out.flush().expect("flush stdout");
}
