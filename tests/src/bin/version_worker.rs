//! The child process of the version-routing test: a resume worker whose
//! application version comes from `KEIRO_APP_VERSION`.
//!
//! ```text
//! version_worker <effects-file> [id..]   enqueue each id, then run a resume worker until killed
//! ```
//! The database is `KEIRO_DATABASE_URL`. The one workflow, `routed`, runs one
//! step whose body appends `<version> <id>` to the effects file: which
//! version's worker ran which instance. Prints `READY <version>` once its
//! worker runs and its ids are enqueued.

use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

use keiro::{step, workflow, Keiro, ResumeOptions};

static EFFECTS: OnceLock<(String, String)> = OnceLock::new();

#[step]
async fn mark(id: String) -> String {
    let (effects, version) = EFFECTS.get().expect("main sets the effects file first");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(effects)
        .expect("open the effects file");
    // One write with O_APPEND: `writeln!` on a file writes each piece of the
    // format on its own, and the other worker's line could land in between.
    file.write_all(format!("{version} {id}\n").as_bytes())
        .expect("record the effect");
    file.sync_all().expect("sync the effects file");
    version.clone()
}

/// The workflow both versions run (in a real fleet, two builds of it).
#[workflow]
pub async fn routed(id: String) -> String {
    mark(id).await
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
    let Some((effects, ids)) = args.split_first() else {
        eprintln!("usage: version_worker <effects-file> [id..]");
        std::process::exit(2);
    };
    let url = std::env::var("KEIRO_DATABASE_URL").expect("KEIRO_DATABASE_URL");
    let keiro = Keiro::connect(&url).await?;
    EFFECTS
        .set((effects.clone(), keiro.app_version().to_owned()))
        .unwrap_or_else(|_| unreachable!("set once"));
    for id in ids {
        routed(id.clone()).id(id).on(&keiro).enqueue().await?;
    }
    let _worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await?;
    say(&format!("READY {}", keiro.app_version()));
    std::future::pending::<()>().await;
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("write stdout");
    out.flush().expect("flush stdout");
}
