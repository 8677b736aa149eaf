//! Workflow deadlines (`call.timeout(d)` / `call.deadline(t)`) on both
//! backends: the instance and its unfinished descendants end as
//! `TimedOut` at the deadline, wherever they stand.

use std::time::{Duration, Instant, SystemTime};

use keiro::{step, workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::process::CrashChild;
use keiro_tests::{on_both_backends, ran, runs, Backend, TestDb};

async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .suspend_after(Duration::from_millis(100))
        .connect()
        .await
        .unwrap()
}

#[step]
async fn tick(key: String, n: u32) -> u32 {
    ran(&key, &format!("tick {n}"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    n
}

#[workflow]
async fn sleeper(key: String) -> u32 {
    let n = tick(key, 0).await;
    keiro::sleep(Duration::from_secs(60)).await;
    n
}

/// Steps back to back, never suspending: only the driver can stop it.
#[workflow]
async fn busy(key: String) -> u32 {
    let mut total = 0;
    for n in 0..10_000 {
        total += tick(key.clone(), n).await;
    }
    total
}

fn fast_worker() -> ResumeOptions {
    ResumeOptions::default()
        .poll_interval(Duration::from_millis(50))
        .log(|_| {})
}

async fn wait_for_runs(key: &str, at_least: usize) {
    for _ in 0..500 {
        if runs(key).len() >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the workflow never ran {at_least} steps");
}

fn assert_timed_out(error: &Error, id: &str, deadline: i64) {
    match error {
        Error::TimedOut {
            id: got,
            deadline: at,
            ..
        } => {
            assert_eq!(got, id);
            let at = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
            assert_eq!(at.as_micros() as i64, deadline, "the stored deadline");
        }
        other => panic!("expected Error::TimedOut for {id}, got: {other}"),
    }
    assert!(
        error.to_string().contains("timed out at its deadline"),
        "{error}"
    );
}

/// The deadline stored with instance `id`.
async fn stored_deadline(keiro: &Keiro, id: &str) -> i64 {
    let row = keiro.store().get_instance(id).await.unwrap();
    row.and_then(|row| row.deadline)
        .expect("the deadline is stored with the instance")
}

/// Waits (at most 20 s) for `handle`'s instance `id` to end timed out at
/// its stored deadline, which it returns.
async fn ends_timed_out<R>(keiro: &Keiro, handle: &keiro::WorkflowHandle<R>, id: &str) -> i64
where
    R: serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let deadline = stored_deadline(keiro, id).await;
    let err = tokio::time::timeout(Duration::from_secs(20), handle.result())
        .await
        .expect("the instance ended in time")
        .unwrap_err();
    assert_timed_out(&err, id, deadline);
    deadline
}

async fn a_sleep_past_the_deadline_ends_at_the_deadline(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let started = Instant::now();
    let handle = sleeper(key.clone())
        .id(&key)
        .timeout(Duration::from_millis(800))
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    let deadline = row
        .deadline
        .expect("the deadline is stored with the instance");
    let err = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("timed out at the deadline, not at the sleep's end")
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(790), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_timed_out(&err, &key, deadline);
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::TimedOut);
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "timed_out");
    assert_eq!((row.wake_at, row.lease_owner), (None, None));
    assert_eq!(runs(&key), ["tick 0"]);
    // Final: a cancel says so, and a later call with the id reads the end.
    assert_eq!(
        keiro.cancel(&key).await.unwrap(),
        keiro::CancelOutcome::AlreadyFinished(WorkflowStatus::TimedOut)
    );
    let again = sleeper(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    assert_timed_out(&again, &key, deadline);
}

async fn a_running_step_loop_is_stopped(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let at = SystemTime::now() + Duration::from_millis(600);
    let handle = busy(key.clone())
        .id(&key)
        .deadline(at)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_for_runs(&key, 3).await;
    let err = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("the run is stopped at the deadline")
        .unwrap_err();
    let deadline = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert_timed_out(&err, &key, deadline);
    assert!(SystemTime::now() >= at);
    let ran_then = runs(&key).len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        runs(&key).len(),
        ran_then,
        "a step body ran after the deadline"
    );
    let journaled = keiro.store().load_journal(&key, 0).await.unwrap().len();
    assert!(
        journaled <= ran_then && journaled < 600 / 20,
        "{journaled} steps journaled"
    );
}

#[workflow]
async fn busy_child(key: String, n: u32) -> u32 {
    busy(format!("{key}-grandchild-{n}")).await.unwrap_or(0)
}

#[workflow]
async fn supervisor(key: String) -> String {
    let a = keiro::spawn(busy_child(key.clone(), 1)).await.unwrap();
    let b = keiro::spawn(busy_child(key.clone(), 2)).await.unwrap();
    match (a.await, b.await) {
        (Err(e), _) | (_, Err(e)) => format!("child error: {e}"),
        (Ok(x), Ok(y)) => format!("{x} {y}"),
    }
}

async fn a_parent_deadline_cascades_to_its_children(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = supervisor(key.clone())
        .id(&key)
        .timeout(Duration::from_millis(1_000))
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_for_runs(&format!("{key}-grandchild-2"), 2).await;
    let deadline = ends_timed_out(&keiro, &handle, &key).await;
    let tree = [
        key.clone(),
        format!("{key}/0"),
        format!("{key}/1"),
        format!("{key}/0/0"),
        format!("{key}/1/0"),
    ];
    for id in &tree {
        let row = keiro.store().get_instance(id).await.unwrap().unwrap();
        assert_eq!(row.status.as_str(), "timed_out", "{id}");
        assert_eq!(row.deadline, Some(deadline), "{id} inherits the deadline");
    }
    let ran_then = runs(&format!("{key}-grandchild-1")).len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&format!("{key}-grandchild-1")).len(), ran_then);
}

#[workflow]
async fn impatient_parent(key: String) -> String {
    let child = sleeper(format!("{key}-child"))
        .timeout(Duration::from_millis(500))
        .await;
    tick(key, 1).await;
    match child {
        Ok(n) => format!("child returned {n}"),
        Err(e) => format!("child: {e}"),
    }
}

async fn a_child_with_an_earlier_deadline_times_out_alone(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    // Runs the suspended child (and parent) when they come due.
    let worker = keiro.resume_worker(fast_worker()).await.unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        impatient_parent(key.clone())
            .id(&key)
            .timeout(Duration::from_secs(3_600))
            .on(&keiro),
    )
    .await
    .expect("the parent goes on once its child timed out")
    .unwrap();
    assert!(out.contains("timed out at its deadline"), "{out}");
    let parent = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(parent.status.as_str(), "completed");
    let child = keiro
        .store()
        .get_instance(&format!("{key}/0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(child.status.as_str(), "timed_out");
    assert!(
        child.deadline.unwrap() < parent.deadline.unwrap(),
        "the child keeps its own, earlier deadline"
    );
    worker.shutdown().await;
}

async fn the_deadline_survives_a_restart(backend: Backend) {
    let db = TestDb::new(backend).await;
    let first = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let started = Instant::now();
    let handle = sleeper(key.clone())
        .id(&key)
        .timeout(Duration::from_millis(1_500))
        .on(&first)
        .start()
        .await
        .unwrap();
    for _ in 0..200 {
        if handle.status().await.unwrap() == WorkflowStatus::Suspended {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    let deadline = stored_deadline(&first, &key).await;
    first.shutdown().await.unwrap();
    drop(handle);

    // Another process (runtime) with only a resume worker ends it on time.
    let second = runtime(&db).await;
    let worker = second.resume_worker(fast_worker()).await.unwrap();
    let handle = second.handle::<u32>(&key).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .unwrap()
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(1_490), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}");
    assert_timed_out(&err, &key, deadline);
    assert_eq!(runs(&key), ["tick 0"], "never run again after the deadline");
    worker.shutdown().await;
}

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

async fn the_deadline_survives_a_sigkill(backend: Backend) {
    let db = TestDb::new(backend).await;
    let id = format!("deadline-{}", uuid::Uuid::new_v4().simple());
    let executor = format!("deadline-test-{}", uuid::Uuid::new_v4().simple());
    let started = Instant::now();
    let args = ["deadline", &id, "60000", "2000"];
    let mut first = CrashChild::start(CHILD, &db, &executor, &args, Some("sleep"));
    first.line_starting("SLEEPING").await;
    first.kill().await; // SIGKILL, mid-sleep, holding the lease
    let watcher = db.keiro().await;
    let deadline = watcher
        .store()
        .get_instance(&id)
        .await
        .unwrap()
        .unwrap()
        .deadline
        .expect("stored before the crash");

    // The same identity restarted (here, in this process, under the same
    // application version) reclaims the instance at once, runs it on, and
    // its driver ends it at the deadline.
    let version = watcher.summary(&id).await.unwrap().version.unwrap();
    let restarted = db
        .builder()
        .executor_id(&executor)
        .app_version(version)
        .connect()
        .await
        .unwrap();
    let worker = restarted.resume_worker(fast_worker()).await.unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        restarted.handle::<(u64, u64)>(&id).await.unwrap().result(),
    )
    .await
    .unwrap()
    .unwrap_err();
    let elapsed = started.elapsed();
    assert_timed_out(&err, &id, deadline);
    assert!(elapsed >= Duration::from_millis(1_990), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");
    let row = watcher.store().get_instance(&id).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "timed_out");
    worker.shutdown().await;
}

/// A resume pass that finds an instance past its deadline ends it and
/// counts it as timed out, not as completed.
async fn a_resume_pass_counts_a_timed_out_instance_apart(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let input = serde_json::json!([key]).to_string();
    keiro::unstable::raw_store(&keiro)
        .create_instances(&[keiro_store::NewInstance {
            deadline: Some(keiro_store::now_us() - 1_000),
            ..keiro_store::NewInstance::new(&key, "sleeper", &input)
        }])
        .await
        .unwrap();
    let summary = keiro
        .resume_once(&ResumeOptions::default().log(|_| {}))
        .await
        .unwrap();
    assert_eq!(
        (summary.resumed, summary.timed_out, summary.completed),
        (1, 1, 0),
        "{summary:?}"
    );
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "timed_out");
}

/// PostgreSQL: a time-out picked as a deadlock's victim (a parent's
/// time-out ending its tree while a child times out on its own lock the
/// same rows in opposite orders) goes again: the caller gets
/// `Error::TimedOut`, not the deadlock. A trigger raising `40P01` on the
/// first time-out stands in for the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_time_out_that_meets_a_deadlock_goes_again() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = runtime(&db).await;
    let keiro_store::Store::Postgres(pg) = keiro::unstable::raw_store(&keiro) else {
        panic!("a PostgreSQL store");
    };
    let trigger = keiro_tests::faults::deadlock_once_on_status(pg.pool(), "timed_out").await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = sleeper(key.clone())
        .id(&key)
        .timeout(Duration::from_millis(500))
        .on(&keiro)
        .start()
        .await
        .unwrap();
    ends_timed_out(&keiro, &handle, &key).await;
    let fired = trigger.fired().await;
    assert!(fired >= 2, "the trigger fired {fired} time(s)");
}

on_both_backends!(
    a_resume_pass_counts_a_timed_out_instance_apart,
    the_deadline_survives_a_sigkill,
    a_sleep_past_the_deadline_ends_at_the_deadline,
    a_running_step_loop_is_stopped,
    a_parent_deadline_cascades_to_its_children,
    a_child_with_an_earlier_deadline_times_out_alone,
    the_deadline_survives_a_restart,
);
