//! Durable sleep on both backends: the deadline is journaled once and replays
//! wake at it; short waits stay in memory; long ones suspend the workflow (no
//! lease, no task) until a worker or the awaiting caller drives it on when due;
//! a process killed mid-sleep and restarted wakes at the original deadline.

use std::time::{Duration, Instant};

use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::process::CrashChild;
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

async fn runtime(db: &TestDb, suspend_after: Duration) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(format!("sleep-{}", uuid::Uuid::new_v4().simple()))
        .suspend_after(suspend_after)
        .connect()
        .await
        .unwrap()
}

#[step]
async fn tick(key: String, label: String) -> String {
    ran(&key, &label);
    label
}

#[workflow]
async fn nap(key: String, millis: u64, times: u32) -> u32 {
    tick(key.clone(), "before".into()).await;
    for _ in 0..times {
        keiro::sleep(Duration::from_millis(millis)).await;
    }
    tick(key, "after".into()).await;
    times
}

async fn short_sleeps_stay_in_memory(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(1)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let started = Instant::now();
    assert_eq!(
        nap(key.clone(), 50, 4).id(&key).on(&keiro).await.unwrap(),
        4
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    let kinds: Vec<_> = journal.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["step", "sleep", "sleep", "sleep", "sleep", "step"]);
    // Each recorded deadline (µs) is at least 50 ms after the one before.
    let deadlines: Vec<i64> = journal[1..5]
        .iter()
        .map(|r| r.result.parse().unwrap())
        .collect();
    assert!(
        deadlines.windows(2).all(|w| w[1] - w[0] >= 50_000),
        "{deadlines:?}"
    );
}

async fn long_sleeps_suspend_and_a_worker_resumes_them_when_due(backend: Backend) {
    let db = TestDb::new(backend).await;
    let starter = runtime(&db, Duration::from_millis(100)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = nap(key.clone(), 700, 1)
        .id(&key)
        .on(&starter)
        .start()
        .await
        .unwrap();
    // It suspends: no lease, a wake time, status suspended.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if handle.status().await.unwrap() == WorkflowStatus::Suspended {
            break;
        }
        assert!(Instant::now() < deadline, "never suspended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row = starter.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(row.lease_owner, None);
    let journal = starter.store().load_journal(&key, 0).await.unwrap();
    // The deadline is journaled in µs, the row's unit: it wakes at exactly it.
    let recorded: i64 = journal[1].result.parse().unwrap();
    assert_eq!(row.wake_at, Some(recorded));
    // Another process's worker: nothing is due before the deadline...
    let worker = runtime(&db, Duration::from_millis(100)).await;
    assert_eq!(worker.resume_once(&quiet()).await.unwrap().discovered, 0);
    // ...and it runs it on once due, without re-running the first step.
    let wait = (recorded - keiro_store::now_us()).max(0) as u64;
    tokio::time::sleep(Duration::from_micros(wait) + Duration::from_millis(20)).await;
    let summary = worker.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.discovered, summary.resumed, summary.completed),
        (1, 1, 1)
    );
    assert!(keiro_store::now_us() >= recorded);
    let other: u32 = worker.handle(&key).await.unwrap().result().await.unwrap();
    assert_eq!(other, 1);
    assert_eq!((count(&key, "before"), count(&key, "after")), (1, 1));
}

async fn a_suspended_sleep_counts_as_still_suspended(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(100)).await;
    let key = uuid::Uuid::new_v4().to_string();
    nap(key.clone(), 60_000, 1)
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.resumed, summary.still_suspended, summary.completed),
        (1, 1, 0)
    );
    assert_eq!(keiro.resume_once(&quiet()).await.unwrap().discovered, 0);
    assert_eq!(count(&key, "before"), 1);
}

async fn awaiting_a_suspending_workflow_returns_when_due(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(50)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let started = Instant::now();
    // No resume worker anywhere: the awaiting caller drives it on when due.
    assert_eq!(
        nap(key.clone(), 300, 2).id(&key).on(&keiro).await.unwrap(),
        2
    );
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!((count(&key, "before"), count(&key, "after")), (1, 1));
}

on_both_backends!(
    short_sleeps_stay_in_memory,
    long_sleeps_suspend_and_a_worker_resumes_them_when_due,
    a_suspended_sleep_counts_as_still_suspended,
    awaiting_a_suspending_workflow_returns_when_due,
    killed_mid_sleep_wakes_at_the_original_deadline,
);

#[tokio::test]
async fn outside_a_workflow_sleep_is_a_plain_sleep() {
    let started = Instant::now();
    keiro::sleep(Duration::from_millis(30)).await;
    keiro::sleep_until(std::time::SystemTime::now() + Duration::from_millis(30)).await;
    assert!(started.elapsed() >= Duration::from_millis(60));
}

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

async fn killed_mid_sleep_wakes_at_the_original_deadline(backend: Backend) {
    let db = TestDb::new(backend).await;
    let executor = format!("sleeper-{}", uuid::Uuid::new_v4().simple());
    let args = ["sleep", "nap-1", "3000"];
    let mut first = CrashChild::start(CHILD, &db, &executor, &args, Some("sleep"));
    first.line_starting("SLEEPING").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.kill().await; // SIGKILL during the sleep
    tokio::time::sleep(Duration::from_secs(1)).await;

    let restarted = CrashChild::start(CHILD, &db, &executor, &["resume", "nap-1"], None);
    let (out, _) = restarted.done().await;
    let (before, after): (u64, u64) = serde_json::from_value(out).unwrap();
    let slept = after - before;
    // The original deadline (before + 3 s), not restart + 3 s (>= before + 4.3 s).
    assert!(
        (3000..3900).contains(&slept),
        "woke {slept} ms after the sleep began"
    );
}
