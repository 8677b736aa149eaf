//! Journal and replay, on both backends: recorded steps are never re-run, step
//! ids follow call order, retries journal their final result, and journaled
//! clocks and ids come back unchanged.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use keiro::{step, workflow, WorkflowStatus};
use keiro_tests::{count, on_both_backends, ran, runs, Backend, TestDb};

/// Test keys whose next `maybe_crash` call panics once.
static CRASH_ONCE: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn arm_crash(key: &str) {
    CRASH_ONCE.lock().unwrap().push(key.to_owned());
}

#[step]
async fn add(key: String, label: String, n: u32) -> u32 {
    ran(&key, &label);
    n + 1
}

#[step]
async fn maybe_crash(key: String) -> bool {
    let mut armed = CRASH_ONCE.lock().unwrap();
    if let Some(i) = armed.iter().position(|k| *k == key) {
        armed.remove(i);
        drop(armed);
        panic!("crash requested for {key}");
    }
    ran(&key, "maybe_crash");
    true
}

#[workflow]
async fn three_steps(key: String) -> u32 {
    let a = add(key.clone(), "one".into(), 0).await;
    let b = add(key.clone(), "two".into(), a).await;
    maybe_crash(key.clone()).await;
    add(key, "three".into(), b).await
}

async fn finished_id_returns_stored_output_without_running(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let first = three_steps(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(first, 3);
    assert_eq!(runs(&key), ["one", "two", "maybe_crash", "three"]);
    let again = three_steps(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(again, 3);
    assert_eq!(runs(&key).len(), 4, "a finished workflow ran steps again");
    let handle = keiro.handle::<u32>(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);
}

async fn crashed_run_replays_recorded_steps(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    arm_crash(&key);
    let err = three_steps(key.clone())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(matches!(err, keiro::Error::Panicked { .. }), "{err}");
    assert!(err.to_string().contains("crash requested"), "{err}");
    assert_eq!(runs(&key), ["one", "two"]);
    let out = three_steps(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, 3);
    assert_eq!(runs(&key), ["one", "two", "maybe_crash", "three"]);
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    let names: Vec<_> = journal.iter().map(|r| (r.seq, r.name.as_str())).collect();
    assert_eq!(
        names,
        [(0, "add"), (1, "add"), (2, "maybe_crash"), (3, "add")]
    );
}

#[step]
async fn slow(key: String) -> String {
    tokio::time::sleep(Duration::from_millis(80)).await;
    ran(&key, "slow");
    "slow".into()
}

#[step]
async fn fast(key: String) -> String {
    ran(&key, "fast");
    "fast".into()
}

#[workflow]
async fn joined(key: String) -> (String, String) {
    let pair = tokio::join!(slow(key.clone()), fast(key.clone()));
    maybe_crash(key).await;
    pair
}

async fn join_allocates_ids_in_call_order(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    arm_crash(&key);
    joined(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    // `fast` finished (and was recorded) first, yet `slow` was called first.
    assert_eq!(runs(&key), ["fast", "slow"]);
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    let names: Vec<_> = journal.iter().map(|r| (r.seq, r.name.as_str())).collect();
    assert_eq!(names, [(0, "slow"), (1, "fast")]);
    let out = joined(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, ("slow".to_string(), "fast".to_string()));
    assert_eq!(runs(&key), ["fast", "slow", "maybe_crash"]);
}

#[step(max_attempts = 4, backoff_ms = 5)]
async fn flaky(key: String, fail_times: u32) -> Result<u32, String> {
    ran(&key, "flaky");
    let n = count(&key, "flaky") as u32;
    if n <= fail_times {
        Err(format!("attempt {n} failed"))
    } else {
        Ok(n)
    }
}

#[workflow]
async fn retrying(key: String, fail_times: u32) -> Result<u32, String> {
    let n = flaky(key.clone(), fail_times).await;
    maybe_crash(key).await;
    n
}

async fn retries_journal_the_final_result(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;

    // Succeeds on the third attempt: Ok(3) is journaled once.
    let key = uuid::Uuid::new_v4().to_string();
    arm_crash(&key);
    retrying(key.clone(), 2)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert_eq!(count(&key, "flaky"), 3);
    let out = retrying(key.clone(), 2).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(3));
    assert_eq!(count(&key, "flaky"), 3, "a journaled step ran again");

    // Never succeeds: the fourth Err is final, journaled and replayed.
    let key = uuid::Uuid::new_v4().to_string();
    arm_crash(&key);
    retrying(key.clone(), 10)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert_eq!(count(&key, "flaky"), 4);
    let out = retrying(key.clone(), 10).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Err("attempt 4 failed".to_string()));
    assert_eq!(count(&key, "flaky"), 4);
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal[0].result, r#"{"Err":"attempt 4 failed"}"#);
    // A workflow returning Err is terminal and failed.
    let handle = keiro.handle::<Result<u32, String>>(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Failed);
    assert_eq!(
        handle.result().await.unwrap(),
        Err("attempt 4 failed".into())
    );
}

#[workflow]
async fn clock(key: String) -> (SystemTime, keiro::Uuid) {
    let t = keiro::now().await;
    let u = keiro::uuid().await;
    maybe_crash(key).await;
    (t, u)
}

async fn now_and_uuid_are_journaled(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    arm_crash(&key);
    clock(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal.len(), 2);
    assert_eq!(
        (journal[0].kind.as_str(), journal[1].kind.as_str()),
        ("now", "uuid")
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (t, u) = clock(key.clone()).id(&key).on(&keiro).await.unwrap();
    let recorded_t: SystemTime = serde_json::from_str(&journal[0].result).unwrap();
    let recorded_u: keiro::Uuid = serde_json::from_str(&journal[1].result).unwrap();
    assert_eq!(t, recorded_t);
    assert_eq!(u, recorded_u);
}

on_both_backends!(
    finished_id_returns_stored_output_without_running,
    crashed_run_replays_recorded_steps,
    join_allocates_ids_in_call_order,
    retries_journal_the_final_result,
    now_and_uuid_are_journaled,
);

#[tokio::test]
async fn steps_outside_a_workflow_are_plain_calls() {
    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(add(key.clone(), "plain".into(), 41).await, 42);
    assert_eq!(flaky(key.clone(), 1).await, Ok(2));
    assert_eq!(runs(&key), ["plain", "flaky", "flaky"]);
}
