//! The queues and the workflow of the queue tests (`tests/queues.rs`), shared
//! with the `queue_worker` processes those tests start.
//!
//! [`queue_job`] records its step's start and end, with the process id and
//! the wall-clock time in µs, as lines of a file, so a test can replay how
//! many ran at once, in which process and in what order.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro::{step, workflow};

keiro::queue!(
    /// At most two running across every worker process.
    pub CONCURRENCY_2 = "test-concurrency-2", concurrency = 2
);
keiro::queue!(
    /// At most one running in each worker process.
    pub PER_WORKER_1 = "test-per-worker-1", worker_concurrency = 1
);
keiro::queue!(
    /// At most 20 starts within any second.
    pub RATE_20 = "test-rate-20", rate_limit = (20, Duration::from_secs(1))
);
keiro::queue!(
    /// One at a time per partition.
    pub ONE_AT_A_TIME = "test-one-at-a-time", concurrency = 1
);
keiro::queue!(
    /// No limits: for dedup and delay.
    pub PLAIN = "test-plain"
);

/// One record of a job's step: `start` or `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `start` or `end`.
    pub what: String,
    /// The job's tag.
    pub tag: String,
    /// The process the step ran in.
    pub pid: u32,
    /// When (µs since the Unix epoch).
    pub at_us: i64,
}

/// Records the start, holds `hold_ms`, records the end.
#[step]
async fn hold(file: String, tag: String, hold_ms: u64) -> Result<(), String> {
    record(&file, "start", &tag);
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    record(&file, "end", &tag);
    Ok(())
}

/// Records that `tag`'s first step ran.
#[step]
async fn first(file: String, tag: String) -> Result<(), String> {
    record(&file, "first", &tag);
    Ok(())
}

/// Records its start, then waits (up to a minute) until file `gate` exists.
#[step]
async fn until_open(file: String, tag: String, gate: String) -> Result<(), String> {
    record(&file, "start", &tag);
    for _ in 0..3000 {
        if Path::new(&gate).exists() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("gate {gate} stayed shut for a minute"))
}

/// A queued job of two steps: one that records it ran, then one that waits
/// for file `gate`, so a test can stop it between the two.
#[workflow]
pub async fn gated_job(file: String, tag: String, gate: String) -> Result<String, String> {
    first(file.clone(), tag.clone()).await?;
    until_open(file, tag.clone(), gate).await?;
    Ok(tag)
}

/// Records `end` for its job when dropped: when the step returns, or when
/// its run is stopped in the middle of it.
struct RecordsEnd {
    file: String,
    tag: String,
}

impl Drop for RecordsEnd {
    fn drop(&mut self) {
        record(&self.file, "end", &self.tag);
    }
}

/// Records its start, then holds until its run is stopped (a minute at
/// most), recording the end either way.
#[step]
async fn until_stopped(file: String, tag: String) -> Result<(), String> {
    record(&file, "start", &tag);
    let _end = RecordsEnd { file, tag };
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

/// A queued job whose one step runs until the run is stopped (cancelled),
/// recording its start and the moment it stopped.
#[workflow]
pub async fn held_job(file: String, tag: String) -> Result<String, String> {
    until_stopped(file, tag.clone()).await?;
    Ok(tag)
}

/// A queued job that records its first step, sleeps `sleep_ms` durably
/// (suspending when that is longer than the runtime's `suspend_after`), then
/// records a second step's start and end.
#[workflow]
pub async fn sleeping_job(file: String, tag: String, sleep_ms: u64) -> Result<String, String> {
    first(file.clone(), tag.clone()).await?;
    keiro::sleep(Duration::from_millis(sleep_ms)).await;
    hold(file, tag.clone(), 1).await?;
    Ok(tag)
}

/// A queued job: one step that records its start and end in `file`.
#[workflow]
pub async fn queue_job(file: String, tag: String, hold_ms: u64) -> Result<String, String> {
    hold(file, tag.clone(), hold_ms).await?;
    Ok(tag)
}

/// Spawns a `queue_job` child on a queue, and returns what the spawn said.
/// (Here, not in the test file: a workflow declared only in the test binary
/// would change its default application version, and the `queue_worker`
/// processes would not claim its instances.)
#[workflow]
pub async fn spawns_on_a_queue() -> Result<String, String> {
    let child = queue_job("unused".into(), "child".into(), 1).queue(&ONE_AT_A_TIME);
    match keiro::spawn(child).await {
        Ok(_) => Ok("spawned".into()),
        Err(error) => Err(error.to_string()),
    }
}

fn record(file: &str, what: &str, tag: &str) {
    let at_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros();
    let line = format!("{what} {tag} {} {at_us}\n", std::process::id());
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .expect("open the events file");
    // One write of one short line: appends from several processes interleave
    // whole lines.
    out.write_all(line.as_bytes()).expect("record the event");
}

/// The events recorded in `file`, in time order.
pub fn events(file: &Path) -> Vec<Event> {
    let mut events: Vec<Event> = crate::process::lines_of(file)
        .iter()
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            Event {
                what: parts[0].to_owned(),
                tag: parts[1].to_owned(),
                pid: parts[2].parse().expect("a pid"),
                at_us: parts[3].parse().expect("a time"),
            }
        })
        .collect();
    events.sort_by_key(|e| (e.at_us, e.what == "start"));
    events
}

/// The most jobs running at once, over all events and per process (by
/// pid): each start raises its count, each end lowers it (at equal times an
/// end comes first, so back-to-back jobs do not overlap).
pub fn max_in_flight(events: &[Event]) -> (usize, std::collections::HashMap<u32, usize>) {
    let (mut now, mut max) = (0usize, 0usize);
    let mut per = std::collections::HashMap::<u32, (usize, usize)>::new();
    for event in events {
        let slot = per.entry(event.pid).or_default();
        if event.what == "start" {
            now += 1;
            slot.0 += 1;
        } else {
            now -= 1;
            slot.0 -= 1;
        }
        max = max.max(now);
        slot.1 = slot.1.max(slot.0);
    }
    (max, per.into_iter().map(|(pid, (_, m))| (pid, m)).collect())
}
