//! Workflows shared by the integration tests and the `crash_workflow` child
//! process they start and kill.

use std::io::Write;

use keiro::{step, workflow};

/// The environment variable naming the checkpoint at which the child blocks
/// (printing `CRASH_POINT k`) so the test can SIGKILL it there.
pub const CRASH_AT_ENV: &str = "KEIRO_TEST_CRASH_AT";

/// Appends one line to a side-effect file (one `write` with `O_APPEND`, so
/// lines from several processes never interleave).
pub fn append_line(path: &str, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open side-effect file {path}: {e}"));
    file.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("append to {path}: {e}"));
}

/// Blocks forever at checkpoint `k` when [`CRASH_AT_ENV`] says so, after
/// telling the parent on stdout.
pub fn checkpoint(k: u32) {
    if std::env::var(CRASH_AT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(k)
    {
        println!("CRASH_POINT {k}");
        std::io::stdout().flush().ok();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// A step with a visible side effect: appends `step n` to `file`.
#[step]
pub async fn effect(file: String, n: u32) -> u32 {
    append_line(&file, &format!("step {n}"));
    n
}

/// Five side-effecting steps with a crash checkpoint after each (and one
/// before the first). Returns 1 + 2 + 3 + 4 + 5.
#[workflow]
pub async fn five_steps(file: String) -> u32 {
    let mut total = 0;
    checkpoint(0);
    for n in 1..=5 {
        total += effect(file.clone(), n).await;
        checkpoint(n);
    }
    total
}

/// A step recording which process ran which step of which workflow.
#[step]
pub async fn mark(file: String, workflow: u32, n: u32) -> u32 {
    append_line(&file, &format!("{workflow} {n} {}", std::process::id()));
    n
}

/// Three marking steps; returns `workflow * 10 + 3`.
#[workflow]
pub async fn three_marks(file: String, workflow: u32) -> u32 {
    let mut last = 0;
    for n in 1..=3 {
        last = mark(file.clone(), workflow, n).await;
    }
    workflow * 10 + last
}

/// Records the (journaled) time, sleeps durably for `millis`, records the time
/// again: returns both, in ms since the Unix epoch. Prints `SLEEPING` (to the
/// parent test) just before the sleep on its first run.
#[workflow]
pub async fn sleepy(millis: u64) -> (u64, u64) {
    let before = keiro::now().await;
    if std::env::var(CRASH_AT_ENV).is_ok() {
        println!("SLEEPING");
        std::io::stdout().flush().ok();
    }
    keiro::sleep(std::time::Duration::from_millis(millis)).await;
    let after = keiro::now().await;
    (unix_ms(before), unix_ms(after))
}

fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Blocks forever at the named point when [`CRASH_AT_ENV`] names it, after
/// telling the parent (`CRASH_POINT <name>`) on stdout.
pub fn pause_at(point: &str) {
    if std::env::var(CRASH_AT_ENV).ok().as_deref() == Some(point) {
        println!("CRASH_POINT {point}");
        std::io::stdout().flush().ok();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Appends `line` to `file` as a journaled step.
#[step]
pub async fn note_line(file: String, line: String) -> bool {
    append_line(&file, &line);
    true
}

/// An approval: creates an awakeable, announces its id (`AWAKEABLE <id>` on
/// stdout, and a `notify` line), waits for the answer, then records `finish`.
/// Crash points: `aw-created`, `aw-waiting`, `aw-consumed`.
#[workflow]
pub async fn approval_flow(file: String) -> String {
    let answer = keiro::awakeable::<String>().await;
    pause_at("aw-created");
    println!("AWAKEABLE {}", answer.id());
    std::io::stdout().flush().ok();
    note_line(file.clone(), "notify".into()).await;
    pause_at("aw-waiting");
    let answer = answer.await.unwrap_or_else(|e| format!("error: {e}"));
    pause_at("aw-consumed");
    note_line(file, "finish".into()).await;
    answer
}

/// A child with one step; crash point `kid-running` inside it.
#[workflow]
pub async fn kid(file: String) -> u32 {
    pause_at("kid-running");
    note_line(file, "kid".into()).await;
    7
}

/// A parent awaiting `kid`. Crash points: `child-started` (after the spawn),
/// `child-consumed` (after its result).
#[workflow]
pub async fn family(file: String) -> u32 {
    let child = keiro::spawn(kid(file.clone())).await.expect("spawn");
    pause_at("child-started");
    let n = child.await.unwrap_or(0);
    pause_at("child-consumed");
    note_line(file, "parent".into()).await;
    n + 1
}

/// Messages and streams across crashes: streams 1, 2, 3 to `log` (crash
/// points `streamed-1..3` after each), sets event `stage` to `receiving`,
/// prints `RECEIVING`, takes a number
/// from `inbox` (noting `got <n>` as a step), prints `DEADLINE_WAIT` and
/// waits up to `deadline_ms` for a second one. Returns the first number and
/// whether the second wait timed out.
#[workflow]
pub async fn mailbox(file: String, deadline_ms: u64) -> Result<(u32, bool), String> {
    let fail = |e: keiro::Error| e.to_string();
    for i in 1..=3u32 {
        keiro::write_stream("log", &i).await.map_err(fail)?;
        pause_at(&format!("streamed-{i}"));
    }
    keiro::set_event("stage", "receiving").await.map_err(fail)?;
    println!("RECEIVING");
    std::io::stdout().flush().ok();
    let first = keiro::recv::<u32>("inbox").await.map_err(fail)?;
    note_line(file, format!("got {first}")).await;
    println!("DEADLINE_WAIT");
    std::io::stdout().flush().ok();
    let second = keiro::recv::<u32>("inbox")
        .timeout(std::time::Duration::from_millis(deadline_ms))
        .await
        .map_err(fail)?;
    Ok((first, second.is_none()))
}

/// Appends `race step` to `file`; slow (it loses the race) while
/// [`CRASH_AT_ENV`] is set, as in the process that is killed, and instant
/// afterwards, so a restarted run would take it if it raced again.
#[step]
pub async fn race_step(file: String) -> u32 {
    append_line(&file, "race step");
    if std::env::var(CRASH_AT_ENV).is_ok() {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    7
}

/// Races [`race_step`] against a 200 ms sleep, blocks at `after-select`
/// (the decision is journaled), then notes the winner in `file`.
#[workflow]
pub async fn select_race(file: String) -> String {
    let won = keiro::select! {
        v = race_step(file.clone()) => format!("step {v}"),
        _ = keiro::sleep(std::time::Duration::from_millis(200)) => "sleep".to_owned(),
    };
    pause_at("after-select");
    note_line(file, format!("won {won}")).await;
    won
}

/// A step of a pipelined run: appends `step n` to `file`, then takes
/// `pace_ms` so the run lasts long enough to be killed midway.
#[step]
pub async fn paced(file: String, n: u32, pace_ms: u64) -> u32 {
    append_line(&file, &format!("step {n}"));
    tokio::time::sleep(std::time::Duration::from_millis(pace_ms)).await;
    n
}

/// `steps` paced steps with a pipelined journal; after step `steps / 2` it
/// sets event `half` to that step's number (a durability barrier). Returns
/// the sum of 1..=steps.
#[workflow(journal = "pipelined")]
pub async fn pipelined_steps(file: String, steps: u32, pace_ms: u64) -> Result<u32, String> {
    let mut total = 0;
    for n in 1..=steps {
        total += paced(file.clone(), n, pace_ms).await;
        if n == steps / 2 {
            keiro::set_event("half", &n)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(total)
}
