//! `keiro::select!` and `.timeout(d)` on awakeables and child handles, on
//! both backends: the journaled winner is taken on replay even when another
//! branch would now win first, a step beats a long sleep, a message or a
//! sleep wins across a suspension, and awaits bounded by a deadline.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::process::{lines_of, CrashChild};
use keiro_tests::{on_both_backends, Backend, TestDb};

/// How often each keyed step body started.
static RUNS: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);

fn started(key: &str) -> u32 {
    let mut runs = RUNS.lock().unwrap();
    let n = runs
        .get_or_insert_with(HashMap::new)
        .entry(key.to_owned())
        .or_default();
    *n += 1;
    *n
}

fn runs(key: &str) -> u32 {
    RUNS.lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(key).copied())
        .unwrap_or(0)
}

/// Slow the first time it runs for `key` (it loses to a short sleep), instant
/// afterwards (it would win a race polled in order).
#[step]
async fn slow_then_instant(key: String) -> u32 {
    if started(&format!("{key}/slow")) == 1 {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    7
}

/// Panics (a crash) the first time it runs for `key`.
#[step]
async fn crash_once(key: String) -> bool {
    if started(&format!("{key}/crash")) == 1 {
        panic!("crash after the select of {key}");
    }
    true
}

/// A race a replay must decide the way the first run did.
#[workflow]
async fn replayed_race(key: String) -> String {
    let won = keiro::select! {
        v = slow_then_instant(key.clone()) => format!("step {v}"),
        _ = keiro::sleep(Duration::from_millis(100)) => "sleep".to_owned(),
    };
    crash_once(key).await;
    won
}

#[step]
async fn quick(n: u32) -> u32 {
    n * 2
}

/// A step against an hour-long sleep.
#[workflow]
async fn step_or_sleep(n: u32) -> u32 {
    keiro::select! {
        v = quick(n) => v,
        _ = keiro::sleep(Duration::from_secs(3600)) => 0,
    }
}

#[step]
async fn slow_step(ms: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    ms
}

/// A step taking `step_ms` against a sleep of `sleep_ms`.
#[workflow]
async fn slow_step_or_sleep(step_ms: u64, sleep_ms: u64) -> Option<u64> {
    keiro::select! {
        v = slow_step(step_ms) => Some(v),
        _ = keiro::sleep(Duration::from_millis(sleep_ms)) => None,
    }
}

/// Journals, as another executor would, that the select at step 1 of
/// instance `id` was won by its branch 1.
#[step]
async fn decide_elsewhere(url: String, id: String) -> bool {
    let other = Keiro::connect(&url).await.expect("connect");
    let decision = keiro_store::StepRow {
        workflow_id: id,
        generation: 0,
        seq: 1,
        name: "select".into(),
        kind: "select".into(),
        result: "1".into(),
    };
    keiro::unstable::raw_store(&other)
        .append_steps(&[decision])
        .await
        .expect("append");
    other.store().close().await;
    true
}

/// A select another executor decided while this run was under way.
#[workflow]
async fn decided_elsewhere(url: String, id: String) -> String {
    decide_elsewhere(url, id).await;
    keiro::select! {
        v = quick(1) => format!("step {v}"),
        _ = keiro::sleep(Duration::from_millis(200)) => "sleep".to_owned(),
    }
}

/// A message on "go" against a sleep of `ms`.
#[workflow]
async fn message_or_sleep(ms: u64) -> Result<Option<String>, String> {
    keiro::select! {
        m = keiro::recv::<String>("go") => m.map(Some).map_err(|e| e.to_string()),
        _ = keiro::sleep(Duration::from_millis(ms)) => Ok(None),
    }
}

/// Publishes an awakeable's id as event "id", then waits for it at most `ms`.
#[workflow]
async fn bounded_approval(ms: u64) -> Result<Option<bool>, String> {
    let approval = keiro::awakeable::<bool>().await;
    keiro::set_event("id", approval.id())
        .await
        .map_err(|e| e.to_string())?;
    approval
        .timeout(Duration::from_millis(ms))
        .await
        .map_err(|e| e.to_string())
}

/// A child that sleeps `ms` and returns it.
#[workflow]
async fn dawdle(ms: u64) -> u64 {
    keiro::sleep(Duration::from_millis(ms)).await;
    ms
}

/// Waits for a child sleeping `child_ms` at most `limit_ms`.
#[workflow]
async fn bounded_child(child_ms: u64, limit_ms: u64) -> Result<Option<u64>, String> {
    let child = keiro::spawn(dawdle(child_ms))
        .await
        .map_err(|e| e.to_string())?;
    child
        .timeout(Duration::from_millis(limit_ms))
        .await
        .map_err(|e| e.to_string())
}

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// The winner's index journaled by the select whose decision is step `seq`.
async fn decision(keiro: &Keiro, id: &str, seq: i64) -> String {
    let store = keiro::unstable::raw_store(keiro);
    let row = store
        .get_step(id, 0, seq)
        .await
        .unwrap()
        .expect("journaled");
    assert_eq!((row.kind.as_str(), row.name.as_str()), ("select", "select"));
    row.result
}

async fn wait_for_status(
    handle: &keiro::WorkflowHandle<impl serde::de::DeserializeOwned>,
    want: WorkflowStatus,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while handle.status().await.unwrap() != want {
        assert!(Instant::now() < deadline, "never {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn the_journaled_winner_is_taken_on_replay(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.builder().max_attempts(3).connect().await.unwrap();
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let key = fresh("replayed");
    let handle = replayed_race(key.clone())
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result())
        .await
        .expect("the workflow recovers from its crash")
        .unwrap();
    // The replay took the journaled sleep although the step, polled first,
    // now completes at once.
    assert_eq!(out, "sleep");
    assert_eq!(
        runs(&format!("{key}/crash")),
        2,
        "it crashed, then replayed"
    );
    assert_eq!(
        runs(&format!("{key}/slow")),
        1,
        "the losing step is dropped unpolled on replay"
    );
    assert_eq!(decision(&keiro, &key, 0).await, "1");
    worker.shutdown().await;
}

async fn a_step_beats_a_long_sleep(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = fresh("quick");
    let began = Instant::now();
    let out = step_or_sleep(21).id(&id).on(&keiro).await.unwrap();
    assert_eq!(out, 42);
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(decision(&keiro, &id, 0).await, "0");
    // Replaying the finished journal gives the same answer.
    let again = step_or_sleep(21).id(&id).on(&keiro).await.unwrap();
    assert_eq!(again, 42);
}

async fn a_sleep_longer_than_suspend_after_still_beats_a_slow_step(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    // The sleep would suspend alone, but the step is still running: it
    // waits in memory and wins at its deadline.
    let began = Instant::now();
    let id = fresh("bounded-step");
    let out = slow_step_or_sleep(20_000, 300)
        .id(&id)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, None);
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(decision(&keiro, &id, 0).await, "1");
    // And a step that ends first wins, after the sleep asked to suspend.
    let id = fresh("quick-step");
    let out = slow_step_or_sleep(200, 20_000)
        .id(&id)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Some(200));
}

async fn a_winner_another_executor_journaled_first_stands(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = fresh("elsewhere");
    // The step wins here, but the journal already names the sleep: the run
    // follows the sleep's branch.
    let out = decided_elsewhere(db.url.clone(), id.clone())
        .id(&id)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, "sleep");
    assert_eq!(decision(&keiro, &id, 1).await, "1");
}

async fn a_message_wins_across_a_suspension(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_secs(30)))
        .await
        .unwrap();
    let id = fresh("msg");
    let handle = message_or_sleep(3_600_000)
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    wait_for_status(&handle, WorkflowStatus::Suspended).await;
    let row = keiro::unstable::raw_store(&keiro)
        .get_instance(&id)
        .await
        .unwrap()
        .unwrap();
    let hour_away = keiro_store::now_us() + 3_000_000_000;
    assert!(
        row.wake_at.is_some_and(|w| w > hour_away),
        "suspended until the sleep's deadline: {:?}",
        row.wake_at
    );
    let sender = match backend {
        Backend::Postgres | Backend::PgBouncer => db.keiro().await,
        Backend::Sqlite => keiro.clone(),
    };
    sender.send(&id, "go", "now").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("the message woke it before the 30 s poll")
        .unwrap();
    assert_eq!(out, Ok(Some("now".to_owned())));
    assert_eq!(decision(&keiro, &id, 0).await, "0");
    worker.shutdown().await;
}

async fn a_sleep_wins_across_a_suspension(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let id = fresh("nap");
    let began = Instant::now();
    let handle = message_or_sleep(600)
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    wait_for_status(&handle, WorkflowStatus::Suspended).await;
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, Ok(None));
    assert!(began.elapsed() >= Duration::from_millis(600));
    assert_eq!(decision(&keiro, &id, 0).await, "1");
    // A message sent now finds the instance ended: the race is over.
    assert!(keiro.send(&id, "go", "late").await.is_err());
    worker.shutdown().await;
}

/// The awakeable id that `bounded_approval` `id` published.
async fn published_id(keiro: &Keiro, id: &str) -> String {
    keiro
        .get_event::<String>(id, "id")
        .wait(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the awakeable's id was published")
}

async fn an_awakeable_timeout_yields_the_answer_or_none(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    // Answered before the deadline (after the run suspended).
    let id = fresh("answered");
    let handle = bounded_approval(3_600_000)
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let awakeable = published_id(&keiro, &id).await;
    wait_for_status(&handle, WorkflowStatus::Suspended).await;
    keiro.resolve_awakeable(&awakeable, true).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, Ok(Some(true)));
    // Nobody answers: None once the deadline passed, across a suspension.
    let id = fresh("unanswered");
    let began = Instant::now();
    let handle = bounded_approval(500)
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let awakeable = published_id(&keiro, &id).await;
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, Ok(None));
    assert!(began.elapsed() >= Duration::from_millis(500));
    // A late answer changes nothing: the instance has ended.
    assert!(keiro.resolve_awakeable(&awakeable, true).await.is_err());
    worker.shutdown().await;
}

async fn a_child_handle_timeout_yields_the_result_or_none(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let id = fresh("fast-child");
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        bounded_child(10, 60_000).id(&id).on(&keiro),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out, Ok(Some(10)));
    let id = fresh("slow-child");
    let began = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        bounded_child(3_600_000, 300).id(&id).on(&keiro),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out, Ok(None));
    assert!(began.elapsed() >= Duration::from_millis(300));
    worker.shutdown().await;
}

async fn outside_a_workflow_select_is_a_plain_race(backend: Backend) {
    let _db = TestDb::new(backend).await;
    let began = Instant::now();
    let out = keiro::select! {
        v = quick(4) => v,
        _ = keiro::sleep(Duration::from_secs(3600)) => 0,
    };
    assert_eq!(out, 8);
    let out = keiro::select! {
        _ = keiro::sleep(Duration::from_secs(3600)) => 0,
        _ = keiro::sleep(Duration::from_millis(10)) => 1,
    };
    assert_eq!(out, 1);
    assert!(began.elapsed() < Duration::from_secs(10));
}

/// The child process of the crash test.
const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

async fn killed_right_after_the_winner_is_journaled_takes_the_same_branch(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let executor = format!("select-crash-{}", uuid::Uuid::new_v4().simple());
    let id = fresh("select-crash");
    let args = ["select", &id, file.to_str().unwrap()];
    let mut first = CrashChild::start(CHILD, &db, &executor, &args, Some("after-select"));
    first.line_starting("CRASH_POINT").await;
    first.kill().await; // SIGKILL, the sleep's win journaled
    assert_eq!(lines_of(&file), ["race step"]);
    // Restarted without the slowdown: the step would now win at once, but
    // the journaled winner stands, and the losing step does not run again.
    let (out, _) = CrashChild::start(CHILD, &db, &executor, &["resume", &id], None)
        .done()
        .await;
    assert_eq!(out, serde_json::json!("sleep"));
    assert_eq!(lines_of(&file), ["race step", "won sleep"]);
}

on_both_backends!(
    the_journaled_winner_is_taken_on_replay,
    a_step_beats_a_long_sleep,
    a_sleep_longer_than_suspend_after_still_beats_a_slow_step,
    a_winner_another_executor_journaled_first_stands,
    a_message_wins_across_a_suspension,
    a_sleep_wins_across_a_suspension,
    an_awakeable_timeout_yields_the_answer_or_none,
    a_child_handle_timeout_yields_the_result_or_none,
    outside_a_workflow_select_is_a_plain_race,
    killed_right_after_the_winner_is_journaled_takes_the_same_branch,
);
