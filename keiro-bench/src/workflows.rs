//! The workflows and steps the workloads run. They are linked into this
//! binary, so its child processes (the same binary) can resume them.

use std::time::Duration;

use keiro::{step, workflow};

use crate::common::{append_line, now_us};

/// A no-op step: returns its argument.
#[step]
pub(crate) async fn noop(n: u32) -> u32 {
    n
}

/// `count` no-op steps one after another; returns the sum of `0..count`.
#[workflow(name = "bench_steps")]
pub(crate) async fn bench_steps(count: u32) -> u32 {
    let mut total = 0;
    for n in 0..count {
        total += noop(n).await;
    }
    total
}

/// [`bench_steps`] with a pipelined journal: each step returns once its row
/// is queued; the run's end waits for the rows.
#[workflow(name = "bench_steps_pipelined", journal = "pipelined")]
pub(crate) async fn bench_steps_pipelined(count: u32) -> u32 {
    let mut total = 0;
    for n in 0..count {
        total += noop(n).await;
    }
    total
}

/// `count` durable sleeps of `millis` each; returns `count`.
#[workflow(name = "bench_sleeps")]
pub(crate) async fn bench_sleeps(count: u32, millis: u64) -> u32 {
    for _ in 0..count {
        keiro::sleep(Duration::from_millis(millis)).await;
    }
    count
}

/// The environment variable that makes [`bench_recovery`] print
/// `STEP2_DONE` and block once step 2 is journaled, for its parent to SIGKILL.
pub(crate) const CRASH_AFTER_2_ENV: &str = "KEIRO_BENCH_CRASH_AFTER_2";

/// A step with a visible side effect: appends `step n` to `file`.
#[step]
pub(crate) async fn effect(file: String, n: u32) -> u32 {
    append_line(&file, &format!("step {n}"));
    n
}

/// Five side-effecting steps; with [`CRASH_AFTER_2_ENV`] set it stops for
/// good after step 2 is journaled. Returns 1 + 2 + 3 + 4 + 5.
#[workflow(name = "bench_recovery")]
pub(crate) async fn bench_recovery(file: String) -> u32 {
    let mut total = 0;
    for n in 1..=5 {
        total += effect(file.clone(), n).await;
        if n == 2 && std::env::var_os(CRASH_AFTER_2_ENV).is_some() {
            crate::common::reply("STEP2_DONE");
            std::future::pending::<()>().await;
        }
    }
    total
}

/// Hands an awakeable id to the wake-latency workload (in this process).
#[step]
pub(crate) async fn announce(sample: u32, id: String) -> bool {
    crate::wake::announce(sample, id);
    true
}

/// The step after the awakeable: records the wall clock as its body starts.
#[step]
pub(crate) async fn woken(sample: u32) -> i64 {
    let at = now_us();
    crate::wake::woken(sample, at);
    at
}

/// Creates an awakeable, announces its id, awaits it, then runs [`woken`].
#[workflow(name = "bench_wake_probe")]
pub(crate) async fn wake_probe(sample: u32) -> i64 {
    let answer = keiro::awakeable::<u64>().await;
    announce(sample, answer.id().to_owned()).await;
    let _answer: Result<u64, keiro::Error> = answer.await;
    woken(sample).await
}

/// Sleeps durably for `millis`, then runs one no-op step; returns 1.
#[workflow(name = "bench_sleeper")]
pub(crate) async fn bench_sleeper(millis: u64) -> u32 {
    keiro::sleep(Duration::from_millis(millis)).await;
    noop(1).await
}

/// Records which process ran which step of which workflow.
#[step]
pub(crate) async fn mark(file: String, workflow: u32, n: u32) -> u32 {
    append_line(&file, &format!("{workflow} {n} {}", std::process::id()));
    n
}

/// Three marking steps; returns 3.
#[workflow(name = "bench_marks")]
pub(crate) async fn bench_marks(file: String, workflow: u32) -> u32 {
    let mut last = 0;
    for n in 1..=3 {
        last = mark(file.clone(), workflow, n).await;
    }
    last
}

/// The step after a received message: reports the message's age.
#[step]
pub(crate) async fn message_seen(sent_at_us: i64) -> bool {
    crate::messages::received(sent_at_us);
    true
}

/// Receives `count` messages (each its sender's clock), running
/// [`message_seen`] after each; returns `count`.
#[workflow(name = "bench_message_probe")]
pub(crate) async fn message_probe(count: u32) -> Result<u32, String> {
    for _ in 0..count {
        let sent: i64 = keiro::recv("m").await.map_err(|e| e.to_string())?;
        message_seen(sent).await;
    }
    Ok(count)
}

/// Receives `count` messages; returns how many it took.
#[workflow(name = "bench_message_sink")]
pub(crate) async fn message_sink(count: u32) -> u32 {
    let mut got = 0;
    for _ in 0..count {
        if keiro::recv::<u32>("m").await.is_ok() {
            got += 1;
        }
    }
    got
}

/// `count` `keiro::select!`s of a no-op step against an hour-long sleep
/// (the step wins each); returns the sum of `0..count`.
#[workflow(name = "bench_selects")]
pub(crate) async fn bench_selects(count: u32) -> u32 {
    let mut total = 0;
    for n in 0..count {
        total += keiro::select! {
            v = noop(n) => v,
            _ = keiro::sleep(Duration::from_secs(3600)) => 0,
        };
    }
    total
}

/// The probe of `cron_lag`: its first step returns the wall clock (µs) as
/// its body starts.
#[workflow(name = "bench_cron_probe")]
pub(crate) async fn cron_probe() -> i64 {
    cron_started().await
}

/// The wall clock as the step's body starts, in µs.
#[step]
pub(crate) async fn cron_started() -> i64 {
    crate::common::now_us()
}
