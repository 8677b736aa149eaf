//! The resume worker's single pass and loop, on both backends: discovery of
//! due work, crash attempts up to a failed instance, unknown names counted and
//! kept, live leases skipped, racing executors converging on one result,
//! options validated, enqueued work picked up promptly.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro::{
    step, workflow, Error, Keiro, ResumeEvent, ResumeOptions, WorkflowHandle, WorkflowStatus,
};
use keiro_store::{Lease, NewInstance, StepRow};
use keiro_tests::queues::{events, max_in_flight, queue_job};
use keiro_tests::{count, on_both_backends, ran, runs, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

#[step]
async fn record(key: String, what: String) -> String {
    ran(&key, &what);
    what
}

#[workflow]
async fn two_records(key: String) -> String {
    let a = record(key.clone(), "a".into()).await;
    let b = record(key, "b".into()).await;
    format!("{a}{b}")
}

/// Enqueues [`two_records`] on `keiro` under a fresh key (also its id).
async fn enqueue_two_records(keiro: &Keiro) -> (String, WorkflowHandle<String>) {
    let key = uuid::Uuid::new_v4().to_string();
    let handle = two_records(key.clone())
        .id(&key)
        .on(keiro)
        .enqueue()
        .await
        .unwrap();
    (key, handle)
}

static PANICS: AtomicU32 = AtomicU32::new(0);

#[workflow]
async fn always_panics(key: String) -> u32 {
    record(key.clone(), "before".into()).await;
    PANICS.fetch_add(1, Ordering::SeqCst);
    panic!("boom in {key}");
}

async fn enqueued_work_is_resumed_by_a_pass(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (key, handle) = enqueue_two_records(&keiro).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Pending);
    assert!(runs(&key).is_empty(), "enqueue ran the workflow");
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.discovered, summary.resumed, summary.completed),
        (1, 1, 1)
    );
    assert_eq!(handle.result().await.unwrap(), "ab");
    assert_eq!(runs(&key), ["a", "b"]);
    // Nothing is due any more.
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.discovered, 0);
}

async fn panics_are_retried_then_marked_failed(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Crash attempts are the runtime's, for its worker as for its own runs.
    let keiro = db.builder().max_attempts(3).connect().await.unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    always_panics(key.clone())
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let options = ResumeOptions::default()
        .log(move |e: &ResumeEvent| sink.lock().unwrap().push(format!("{e:?}")));
    let mut failed = 0;
    for _ in 0..60 {
        let summary = keiro.resume_once(&options).await.unwrap();
        failed += summary.failed;
        if failed > 0 {
            break;
        }
        // Crashed instances come back after a backoff (100 ms, 200 ms, ...).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(failed, 1);
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(row.attempts, 3);
    assert!(row
        .error
        .as_deref()
        .unwrap()
        .contains(&format!("boom in {key}")));
    let handle = keiro.handle::<u32>(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Failed);
    let err = handle.result().await.unwrap_err();
    assert!(
        matches!(err, Error::Failed { .. }) && err.to_string().contains("boom"),
        "{err}"
    );
    assert_eq!(count(&key, "before"), 1, "the journaled step ran again");
    let seen = events.lock().unwrap().clone();
    assert_eq!(seen.iter().filter(|e| e.starts_with("Crashed")).count(), 2);
    assert_eq!(
        seen.iter()
            .filter(|e| e.starts_with("MarkedFailed"))
            .count(),
        1
    );
    // A failed instance is never discovered again.
    assert_eq!(keiro.resume_once(&options).await.unwrap().discovered, 0);
}

async fn unknown_names_are_counted_every_pass_and_kept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let new = NewInstance::new("ghost-1", "retired_workflow", "[]");
    keiro::unstable::raw_store(&keiro)
        .create_instance(&new)
        .await
        .unwrap();
    for _ in 0..2 {
        let summary = keiro.resume_once(&quiet()).await.unwrap();
        assert_eq!(
            (summary.discovered, summary.unknown_name, summary.resumed),
            (1, 1, 0)
        );
    }
    let row = keiro
        .store()
        .get_instance("ghost-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status.as_str(), "pending");
}

async fn live_foreign_leases_are_skipped_and_dead_ones_taken(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let input = serde_json::to_string(&(key.clone(),)).unwrap();
    // Another executor claimed it; its lease is live for a while.
    let lease = Lease {
        owner: "elsewhere",
        ttl_us: 400_000,
    };
    let new = NewInstance {
        lease: Some(lease),
        ..NewInstance::new(&key, "two_records", &input)
    };
    keiro::unstable::raw_store(&keiro)
        .create_instance(&new)
        .await
        .unwrap();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.discovered, summary.resumed),
        (0, 0),
        "a live lease was discovered"
    );
    // Make it due while the lease is still live: the claim is refused.
    keiro::unstable::raw_store(&keiro)
        .reclaim_own("elsewhere")
        .await
        .unwrap();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.discovered, summary.lease_skipped, summary.resumed),
        (1, 1, 0)
    );
    assert!(runs(&key).is_empty());
    // After the TTL the dead executor's lease is taken.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.discovered, summary.resumed, summary.completed),
        (1, 1, 1)
    );
    assert_eq!(runs(&key), ["a", "b"]);
}

async fn racing_executors_converge_on_the_first_result(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let input = serde_json::to_string(&(key.clone(),)).unwrap();
    // A dead executor's lease lapsed after it recorded step 0 with another
    // value than this run's body produces, and this run's writer loses that
    // race: it must continue with the recorded value.
    let lease = Lease {
        owner: "dead",
        ttl_us: -1,
    };
    let new = NewInstance {
        lease: Some(lease),
        ..NewInstance::new(&key, "two_records", &input)
    };
    keiro::unstable::raw_store(&keiro)
        .create_instance(&new)
        .await
        .unwrap();
    let first = StepRow {
        workflow_id: key.clone(),
        generation: 0,
        seq: 0,
        name: "record".into(),
        kind: "step".into(),
        result: "\"A-recorded-first\"".into(),
    };
    // Both writers race on one step id; only one row survives.
    let mine = StepRow {
        result: "\"a\"".into(),
        ..first.clone()
    };
    let (x, y) = tokio::join!(
        keiro::unstable::raw_store(&keiro).append_steps(std::slice::from_ref(&first)),
        keiro::unstable::raw_store(&keiro).append_steps(std::slice::from_ref(&mine)),
    );
    let outcomes = [x.unwrap().remove(0), y.unwrap().remove(0)];
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == keiro_store::AppendOutcome::Inserted)
            .count(),
        1
    );
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal.len(), 1);
    let winner = journal[0].result.clone();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.completed, 1);
    let out: String = keiro.handle(&key).await.unwrap().result().await.unwrap();
    let winner: String = serde_json::from_str(&winner).unwrap();
    assert_eq!(out, format!("{winner}b"));
}

/// Stores through which `contested_step` plays the other executor, per key.
static RIVALS: Mutex<Vec<(String, keiro_store::Store)>> = Mutex::new(Vec::new());

#[step]
async fn contested_step(key: String) -> String {
    let rival = RIVALS
        .lock()
        .unwrap()
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, s)| s.clone());
    if let Some(store) = rival {
        // The other executor records this step id while our body runs.
        let theirs = StepRow {
            workflow_id: key.clone(),
            generation: 0,
            seq: 0,
            name: "contested_step".into(),
            kind: "step".into(),
            result: "\"theirs\"".into(),
        };
        store.append_steps(&[theirs]).await.unwrap();
    }
    ran(&key, "contested_step");
    "mine".into()
}

#[workflow]
async fn contested(key: String) -> String {
    let value = contested_step(key.clone()).await;
    let after = record(key, "after".into()).await;
    format!("{value}-{after}")
}

async fn the_loser_of_a_step_race_continues_with_the_recorded_value(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let rival = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    RIVALS
        .lock()
        .unwrap()
        .push((key.clone(), keiro::unstable::raw_store(&rival).clone()));
    let out = contested(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, "theirs-after");
    assert_eq!(runs(&key), ["contested_step", "after"]);
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal.len(), 2);
    assert_eq!(journal[0].result, "\"theirs\"");
}

#[step]
async fn long_step(key: String) -> String {
    tokio::time::sleep(Duration::from_millis(3000)).await;
    ran(&key, "long_step");
    "slow".into()
}

#[workflow]
async fn long_running(key: String) -> String {
    long_step(key).await
}

async fn a_live_run_renews_its_lease_so_no_worker_takes_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let runner = keiro::Keiro::builder(&db.url)
        .executor_id(format!("runner-{}", uuid::Uuid::new_v4().simple()))
        // Short, so the check below spans two TTLs; not so short that one
        // slow renewal under a loaded CI machine (a round trip of 200 ms
        // once the lease is two thirds through) loses the lease.
        .lease_ttl(Duration::from_millis(1000))
        .connect()
        .await
        .unwrap();
    let other = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = long_running(key.clone())
        .id(&key)
        .on(&runner)
        .start()
        .await
        .unwrap();
    let first_expiry = keiro_lease(&other, &key).await;
    let mut taken = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        taken += other.resume_once(&quiet()).await.unwrap().resumed;
    }
    assert_eq!(taken, 0, "a worker took a live run's lease");
    assert!(
        keiro_lease(&other, &key).await > first_expiry,
        "the lease was not renewed"
    );
    assert_eq!(handle.result().await.unwrap(), "slow");
    assert_eq!(count(&key, "long_step"), 1);
}

async fn keiro_lease(keiro: &keiro::Keiro, id: &str) -> i64 {
    let row = keiro.store().get_instance(id).await.unwrap().unwrap();
    row.lease_expires_at.expect("leased")
}

async fn invalid_options_are_refused_before_anything_runs(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let cases = [
        (quiet().concurrency(0), "concurrency"),
        (quiet().poll_interval(Duration::ZERO), "poll_interval"),
        (quiet().batch_size(0), "batch_size"),
    ];
    for (options, field) in cases {
        let err = keiro.resume_once(&options).await.unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
        assert!(
            matches!(&err, Error::InvalidOption { option, .. } if option.ends_with(field)),
            "{err:?}"
        );
        let err = keiro.resume_worker(options).await.unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
    // The instance policy (crash attempts, lease TTL) is the runtime's,
    // refused by the builder before it connects.
    let builders = [
        (db.builder().max_attempts(0), "max_attempts"),
        (db.builder().lease_ttl(Duration::ZERO), "lease_ttl"),
    ];
    for (builder, field) in builders {
        let err = builder.connect().await.unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
        assert!(
            matches!(&err, Error::InvalidOption { option, .. } if *option == field),
            "{err:?}"
        );
    }
}

async fn a_running_worker_picks_up_enqueued_work_promptly(backend: Backend) {
    let db = TestDb::new(backend).await;
    let worker_side = db.keiro().await;
    let options = quiet().poll_interval(Duration::from_secs(30));
    let worker = worker_side.resume_worker(options).await.unwrap();
    // Enqueue from another runtime (another "process"): on PostgreSQL the
    // worker is woken by NOTIFY; on SQLite both share... nothing, so only the
    // poll would find it: enqueue through the worker's runtime there.
    let enqueuer = match backend {
        Backend::Postgres | Backend::PgBouncer => db.keiro().await,
        Backend::Sqlite => worker_side.clone(),
    };
    let started = std::time::Instant::now();
    let (_, handle) = enqueue_two_records(&enqueuer).await;
    let out = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, "ab");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken only by the 30 s poll"
    );
    worker.shutdown().await;
}

on_both_backends!(
    a_long_run_does_not_hold_up_work_enqueued_after_it,
    overlapping_passes_keep_within_the_concurrency,
    enqueued_work_is_resumed_by_a_pass,
    panics_are_retried_then_marked_failed,
    unknown_names_are_counted_every_pass_and_kept,
    live_foreign_leases_are_skipped_and_dead_ones_taken,
    racing_executors_converge_on_the_first_result,
    the_loser_of_a_step_race_continues_with_the_recorded_value,
    a_live_run_renews_its_lease_so_no_worker_takes_it,
    invalid_options_are_refused_before_anything_runs,
    a_running_worker_picks_up_enqueued_work_promptly,
);

/// A long run holds one slot, not the worker: what is enqueued meanwhile
/// runs at once (the worker has 31 more), not after the long run ends.
async fn a_long_run_does_not_hold_up_work_enqueued_after_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(100)))
        .await
        .unwrap();
    let slow = uuid::Uuid::new_v4().to_string();
    let long = long_running(slow.clone())
        .id(&slow)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    // The long step (3 s) is running.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(long.status().await.unwrap(), WorkflowStatus::Running);
    let (_, handle) = enqueue_two_records(&keiro).await;
    let out = tokio::time::timeout(Duration::from_millis(1500), handle.result())
        .await
        .expect("work enqueued beside a long run waited for it to end")
        .unwrap();
    assert_eq!(out, "ab");
    assert_eq!(long.status().await.unwrap(), WorkflowStatus::Running);
    assert_eq!(long.result().await.unwrap(), "slow");
    worker.shutdown().await;
}

/// The passes overlap, and together they never run more than the worker's
/// concurrency: enqueues arriving while earlier runs go on start only in
/// the slots those leave free.
async fn overlapping_passes_keep_within_the_concurrency(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // Each job records its step's start and end here.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events");
    let worker = keiro
        .resume_worker(
            quiet()
                .concurrency(3)
                .poll_interval(Duration::from_millis(50)),
        )
        .await
        .unwrap();
    let mut handles = Vec::new();
    for n in 0..12 {
        let tag = format!("nap-{n}-{}", uuid::Uuid::new_v4().simple());
        let handle = queue_job(file.display().to_string(), tag.clone(), 150)
            .id(&tag)
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
        handles.push((tag, handle));
        // Each enqueue wakes the worker for a pass of its own.
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for (tag, handle) in handles {
        let out = tokio::time::timeout(Duration::from_secs(20), handle.result())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out, Ok(tag));
    }
    let events = events(&file);
    assert_eq!(events.len(), 24, "every job started and ended once");
    let (most, _) = max_in_flight(&events);
    assert_eq!(most, 3, "at most 3 at once, and 3 reached; saw {most}");
    worker.shutdown().await;
}
