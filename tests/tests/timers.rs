//! Durable timers through `keiro::timers`, on both backends: the worker and
//! each fire outcome, the attempt ceiling, option validation, inspection
//! pages, guarded resume, a SIGKILLed worker process, and (on PostgreSQL) four
//! concurrent drainers. `bench_timers` (ignored) prints throughput and lag.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use keiro::timers::{
    schedule_tx, DrainSummary, FireDisposition, FireOutcome, ScheduleOutcome, TimerChange,
    TimerError, TimerFilter, TimerId, TimerList, TimerPageRequest, TimerReasonFilter, TimerRequest,
    TimerResumeClaim, TimerRow, TimerStatus, TimerWorkerOptions, Timers, MAX_PAGE_LIMIT,
    NOT_MINE_RETRY_DELAY, PANIC_RETRY_DELAY,
};
use keiro_tests::{on_both_backends, Backend, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

on_both_backends!(
    runtime_and_bare_store_share_the_timers,
    schedule_is_idempotent_on_the_id,
    schedule_refuses_a_bad_request,
    schedule_tx_follows_the_callers_transaction,
    each_fire_outcome_is_applied,
    a_panicking_fire_action_is_retried,
    an_outcome_for_a_timer_that_moved_on_is_dropped,
    attempt_ceiling_dead_letters_at_the_documented_count,
    drain_respects_its_limit_and_cannot_spin,
    stale_claims_are_requeued_by_the_next_pass,
    option_validation_refuses_before_anything_runs,
    worker_loop_fires_each_timer_exactly_once,
    killed_worker_fires_again_after_the_stale_ttl,
    pages_visit_every_timer_once_with_inserts_between,
    bad_page_requests_are_refused,
    dead_and_stuck_pages_filter,
    guarded_resume_claim_renew_complete,
    guarded_resume_park_and_cancel,
    guarded_resume_refusals,
    expired_resume_claims_recover_to_dead_in_a_worker_pass,
    id_only_mutations_by_id,
);

// ---------------------------------------------------------------------------
// Helpers

const PM: &str = "checkout";

async fn timers(db: &TestDb) -> Timers {
    Timers::connect(&db.url)
        .await
        .unwrap_or_else(|e| panic!("connect timers to {}: {e}", db.url))
}

fn past(id: &str) -> TimerRequest {
    TimerRequest::new(
        id,
        PM,
        format!("order-{id}"),
        SystemTime::now() - Duration::from_secs(1),
    )
}

async fn schedule(timers: &Timers, request: TimerRequest) {
    let outcome = timers.schedule(&request).await.unwrap();
    assert_eq!(
        outcome,
        ScheduleOutcome::Created,
        "{} should be new",
        request.id
    );
}

async fn row(timers: &Timers, id: &str) -> TimerRow {
    timers
        .get(&TimerId::new(id))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("timer `{id}` should exist"))
}

/// The store's own pool, to begin a transaction for the `*_tx` functions.
enum Pool<'a> {
    Sqlite(&'a sqlx::SqlitePool),
    Postgres(&'a sqlx::PgPool),
}

fn pool(timers: &Timers) -> Pool<'_> {
    let store = timers.store();
    match (store.sqlite_pool(), store.postgres_pool()) {
        (Some(pool), _) => Pool::Sqlite(pool),
        (_, Some(pool)) => Pool::Postgres(pool),
        (None, None) => unreachable!("a store is SQLite or PostgreSQL"),
    }
}

/// Schedules every request in one transaction of the store's own pool.
async fn schedule_all(timers: &Timers, requests: &[TimerRequest]) {
    match pool(timers) {
        Pool::Sqlite(s) => {
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            for request in requests {
                schedule_tx(&mut tx, request).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.unwrap();
            for request in requests {
                schedule_tx(&mut tx, request).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
}

/// A fire action that completes every timer and counts fires per id.
fn counting(
    counts: &Arc<Mutex<HashMap<String, usize>>>,
) -> impl Fn(TimerRow) -> std::future::Ready<FireOutcome> + Send + Sync + 'static {
    let counts = counts.clone();
    move |timer: TimerRow| {
        *counts
            .lock()
            .unwrap()
            .entry(timer.id.to_string())
            .or_default() += 1;
        std::future::ready(FireOutcome::completed(format!("ev-{}", timer.id)))
    }
}

fn no_requeue() -> TimerWorkerOptions {
    TimerWorkerOptions::default()
        .max_attempts(None)
        .requeue_stuck_after(None)
}

async fn dead(timers: &Timers, id: &str, reason: &str) -> TimerRow {
    schedule(timers, past(id)).await;
    let claimed = timers.claim_due().await.unwrap().expect("due");
    assert_eq!(claimed.id.as_str(), id);
    match timers.dead_letter(&claimed.id, reason).await.unwrap() {
        TimerChange::Applied(row) => row,
        other => panic!("dead-letter {id}: {other:?}"),
    }
}

fn never_fires() -> FireOutcome {
    panic!("nothing may fire with bad options")
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// Scheduling

async fn runtime_and_bare_store_share_the_timers(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    schedule(&keiro.timers(), past("from-runtime")).await;
    let bare = timers(&db).await;
    let timer = row(&bare, "from-runtime").await;
    assert_eq!(timer.status, TimerStatus::Scheduled);
    assert_eq!(timer.process_manager, PM);
    assert_eq!(timer.correlation_id, "order-from-runtime");
    assert_eq!(bare.count_due().await.unwrap(), 1);
}

async fn schedule_is_idempotent_on_the_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let later = SystemTime::now() + Duration::from_secs(3600);
    let first = TimerRequest::new("t-1", PM, "order-1", later)
        .payload(serde_json::json!({ "n": 1, "tags": ["a", "b"] }));
    schedule(&timers, first.clone()).await;
    let moved = TimerRequest {
        fire_at: later + Duration::from_secs(60),
        ..first.clone().payload(serde_json::json!({ "n": 2 }))
    };
    assert_eq!(
        timers.schedule(&moved).await.unwrap(),
        ScheduleOutcome::Updated
    );
    let stored = row(&timers, "t-1").await;
    assert_eq!(stored.payload, serde_json::json!({ "n": 2 }));
    assert_eq!(
        stored
            .fire_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
        (later + Duration::from_secs(60))
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
        "stored with millisecond precision"
    );

    assert!(!timers.schedule_once(&first).await.unwrap());
    assert_eq!(row(&timers, "t-1").await.payload["n"], 2);
    assert!(timers.schedule_once(&past("t-2")).await.unwrap());

    #[derive(serde::Deserialize, PartialEq, Debug)]
    struct Payload {
        n: u32,
    }
    assert_eq!(
        row(&timers, "t-1").await.payload_as::<Payload>().unwrap(),
        Payload { n: 2 }
    );
    assert!(matches!(
        row(&timers, "t-2").await.payload_as::<Payload>(),
        Err(TimerError::Payload { .. })
    ));
}

async fn schedule_refuses_a_bad_request(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    for bad in [
        past(""),
        TimerRequest {
            process_manager: String::new(),
            ..past("t-1")
        },
        TimerRequest {
            fire_at: SystemTime::UNIX_EPOCH - Duration::from_secs(1),
            ..past("t-1")
        },
    ] {
        let error = timers.schedule(&bad).await.unwrap_err();
        assert!(
            matches!(error, TimerError::InvalidRequest { .. }),
            "{error}"
        );
    }
    assert_eq!(timers.count_due().await.unwrap(), 0);
}

async fn schedule_tx_follows_the_callers_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    // Rolled back: no timer. Committed: the timer exists and fires.
    match pool(&timers) {
        Pool::Sqlite(s) => {
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            schedule_tx(&mut tx, &past("rolled-back")).await.unwrap();
            tx.rollback().await.unwrap();
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            schedule_tx(&mut tx, &past("committed")).await.unwrap();
            assert!(
                !keiro::timers::schedule_once_tx(&mut tx, &past("committed"))
                    .await
                    .unwrap()
            );
            tx.commit().await.unwrap();
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.unwrap();
            schedule_tx(&mut tx, &past("rolled-back")).await.unwrap();
            tx.rollback().await.unwrap();
            let mut tx = p.begin().await.unwrap();
            schedule_tx(&mut tx, &past("committed")).await.unwrap();
            assert!(
                !keiro::timers::schedule_once_tx(&mut tx, &past("committed"))
                    .await
                    .unwrap()
            );
            tx.commit().await.unwrap();
        }
    }
    assert_eq!(
        timers.get(&TimerId::new("rolled-back")).await.unwrap(),
        None
    );
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let summary = timers
        .drain(&TimerWorkerOptions::default(), 10, counting(&counts))
        .await
        .unwrap();
    assert_eq!(summary.fired, 1);
    assert_eq!(counts.lock().unwrap().get("committed"), Some(&1));

    // Cancel in a transaction too.
    schedule(&timers, past("to-cancel")).await;
    let change = match pool(&timers) {
        Pool::Sqlite(s) => {
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            let change = keiro::timers::cancel_tx(&mut tx, &TimerId::new("to-cancel"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            change
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.unwrap();
            let change = keiro::timers::cancel_tx(&mut tx, &TimerId::new("to-cancel"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            change
        }
    };
    assert!(change.is_applied());
    assert_eq!(
        row(&timers, "to-cancel").await.status,
        TimerStatus::Cancelled
    );
}

// ---------------------------------------------------------------------------
// The worker

async fn each_fire_outcome_is_applied(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    for pm in ["completes", "retries", "fails", "foreign"] {
        schedule(
            &timers,
            TimerRequest {
                process_manager: pm.into(),
                ..past(pm)
            },
        )
        .await;
    }
    let started = SystemTime::now();
    let summary = timers
        .drain(
            &TimerWorkerOptions::default(),
            10,
            |timer: TimerRow| async move {
                match timer.process_manager.as_str() {
                    "completes" => FireOutcome::completed("ev-42"),
                    "retries" => {
                        FireOutcome::retry_later(Duration::from_secs(3600), "upstream busy")
                    }
                    "fails" => FireOutcome::failed_permanently("payload is malformed"),
                    _ => FireOutcome::NotMine,
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(
        summary,
        DrainSummary {
            processed: 4,
            fired: 1,
            retried: 1,
            dead_lettered: 1,
            not_mine: 1,
            backlog: 4,
            ..DrainSummary::default()
        }
    );

    let completed = row(&timers, "completes").await;
    assert_eq!(completed.status, TimerStatus::Fired);
    assert_eq!(completed.event_id.as_deref(), Some("ev-42"));
    assert_eq!(completed.attempts, 1);

    let retried = row(&timers, "retries").await;
    assert_eq!(retried.status, TimerStatus::Scheduled);
    assert_eq!(retried.attempts, 1);
    assert_eq!(retried.last_error.as_deref(), Some("upstream busy"));
    assert!(retried.fire_at >= started + Duration::from_secs(3599));

    let failed = row(&timers, "fails").await;
    assert_eq!(failed.status, TimerStatus::Dead);
    assert_eq!(failed.last_error.as_deref(), Some("payload is malformed"));

    let foreign = row(&timers, "foreign").await;
    assert_eq!(foreign.status, TimerStatus::Scheduled);
    assert!(foreign.fire_at >= started + NOT_MINE_RETRY_DELAY - Duration::from_secs(1));
    assert!(foreign
        .last_error
        .unwrap()
        .contains("no fire action handles process manager `foreign`"));

    // Nothing is due any more.
    assert_eq!(
        timers
            .run_once(&TimerWorkerOptions::default(), |_| async {
                FireOutcome::completed("never")
            })
            .await
            .unwrap(),
        None
    );
}

async fn a_panicking_fire_action_is_retried(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("t-1")).await;
    let report = timers
        .run_once(
            &TimerWorkerOptions::default(),
            |timer: TimerRow| async move {
                if timer.attempts > 0 {
                    panic!("the handler blew up");
                }
                FireOutcome::completed("unreachable")
            },
        )
        .await
        .unwrap()
        .expect("a due timer");
    let FireDisposition::RetryScheduled { note, fire_at } = report.disposition else {
        panic!("a panic is retried, got {:?}", report.disposition)
    };
    assert!(note.contains("the handler blew up"), "{note}");
    assert!(fire_at >= SystemTime::now() + PANIC_RETRY_DELAY - Duration::from_secs(2));
    assert_eq!(row(&timers, "t-1").await.status, TimerStatus::Scheduled);
}

async fn an_outcome_for_a_timer_that_moved_on_is_dropped(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("t-1")).await;
    let canceller = timers.clone();
    let report = timers
        .run_once(&TimerWorkerOptions::default(), move |timer: TimerRow| {
            let canceller = canceller.clone();
            async move {
                // The process manager cancels the timer while it fires.
                assert!(canceller.cancel(&timer.id).await.unwrap().is_applied());
                FireOutcome::completed("late")
            }
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        report.disposition,
        FireDisposition::Superseded {
            status: Some(TimerStatus::Cancelled)
        }
    );
    let stored = row(&timers, "t-1").await;
    assert_eq!(
        (stored.status, stored.event_id),
        (TimerStatus::Cancelled, None)
    );
}

async fn attempt_ceiling_dead_letters_at_the_documented_count(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("t-1")).await;
    let options = TimerWorkerOptions::default().max_attempts(Some(3));
    let fired = Arc::new(Mutex::new(0usize));
    let mut last = None;
    for _ in 0..200 {
        let fired = fired.clone();
        let report = timers
            .run_once(&options, move |_| {
                *fired.lock().unwrap() += 1;
                // Due again at once (just after this pass began).
                std::future::ready(FireOutcome::retry_later(Duration::ZERO, "try again"))
            })
            .await
            .unwrap();
        match report {
            Some(report) => last = Some(report),
            None => tokio::time::sleep(Duration::from_millis(5)).await,
        }
        if row(&timers, "t-1").await.status == TimerStatus::Dead {
            break;
        }
    }
    assert_eq!(
        *fired.lock().unwrap(),
        3,
        "fired exactly max_attempts times"
    );
    let last = last.unwrap();
    assert_eq!(last.timer.attempts, 4, "the fourth claim dead-letters");
    assert_eq!(
        last.disposition,
        FireDisposition::AttemptCeiling {
            reason: "timer exceeded attempt ceiling of 3".into()
        }
    );
    let stored = row(&timers, "t-1").await;
    assert_eq!(stored.status, TimerStatus::Dead);
    assert_eq!(stored.attempts, 4);
    assert_eq!(
        stored.last_error.as_deref(),
        Some("timer exceeded attempt ceiling of 3")
    );
    // With Some(1), the first claim fires and the second dead-letters.
    schedule(&timers, past("t-2")).await;
    let once = TimerWorkerOptions::default().max_attempts(Some(1));
    let first = timers
        .run_once(&once, |_| async {
            FireOutcome::retry_later(Duration::ZERO, "again")
        })
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        first.disposition,
        FireDisposition::RetryScheduled { .. }
    ));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = timers
        .run_once(&once, |_| async { FireOutcome::completed("never") })
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        second.disposition,
        FireDisposition::AttemptCeiling { .. }
    ));
}

async fn drain_respects_its_limit_and_cannot_spin(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    for i in 0..5 {
        schedule(&timers, past(&format!("t-{i}"))).await;
    }
    let options = TimerWorkerOptions::default();
    // An action that always asks to be retried at once is claimed once per pass.
    let retry = |_| async { FireOutcome::retry_later(Duration::ZERO, "again") };
    let summary = timers.drain(&options, 100, retry).await.unwrap();
    assert_eq!((summary.processed, summary.retried), (5, 5));

    tokio::time::sleep(Duration::from_millis(5)).await;
    let limit_0 = timers.drain(&options, 0, retry).await.unwrap();
    assert_eq!((limit_0.processed, limit_0.backlog), (0, 5));
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let mut passes = Vec::new();
    loop {
        let summary = timers.drain(&options, 2, counting(&counts)).await.unwrap();
        passes.push(summary.processed);
        if summary.processed == 0 {
            break;
        }
    }
    assert_eq!(passes, [2, 2, 1, 0]);
    assert!(counts.lock().unwrap().values().all(|&n| n == 1));
}

async fn stale_claims_are_requeued_by_the_next_pass(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("t-1")).await;
    // A worker claims it and dies.
    let claimed = timers.claim_due().await.unwrap().unwrap();
    assert_eq!(claimed.status, TimerStatus::Firing);
    assert_eq!(timers.count_stuck(Duration::ZERO, None).await.unwrap(), 1);

    let options = TimerWorkerOptions::default()
        .max_attempts(None)
        .requeue_stuck_after(Some(Duration::from_millis(300)));
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let early = timers.drain(&options, 10, counting(&counts)).await.unwrap();
    assert_eq!(
        (early.requeued_stuck, early.processed, early.stuck),
        (0, 0, 1)
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let late = timers.drain(&options, 10, counting(&counts)).await.unwrap();
    assert_eq!((late.requeued_stuck, late.fired), (1, 1));
    let stored = row(&timers, "t-1").await;
    assert_eq!((stored.status, stored.attempts), (TimerStatus::Fired, 2));

    // With the requeue off, a stranded claim stays put.
    schedule(&timers, past("t-2")).await;
    timers.claim_due().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let off = timers
        .drain(&no_requeue(), 10, counting(&counts))
        .await
        .unwrap();
    assert_eq!((off.requeued_stuck, off.processed, off.stuck), (0, 0, 1));
    assert_eq!(
        timers
            .requeue_stuck(Duration::from_millis(10))
            .await
            .unwrap(),
        1
    );
}

async fn option_validation_refuses_before_anything_runs(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("t-1")).await;
    let bad_options = [
        (
            "max_attempts",
            TimerWorkerOptions::default().max_attempts(Some(0)),
        ),
        (
            "requeue_stuck_after",
            TimerWorkerOptions::default().requeue_stuck_after(Some(Duration::ZERO)),
        ),
        (
            "requeue_stuck_after",
            TimerWorkerOptions::default().requeue_stuck_after(Some(Duration::from_micros(999))),
        ),
    ];
    let never = |_: TimerRow| async { never_fires() };
    for (name, options) in bad_options {
        let refused =
            |e: TimerError| matches!(e, TimerError::InvalidOption { option, .. } if option == name);
        assert!(refused(options.validate().unwrap_err()));
        assert!(refused(timers.run_once(&options, never).await.unwrap_err()));
        assert!(refused(
            timers.drain(&options, 10, never).await.unwrap_err()
        ));
        let spawned = timers.spawn_worker(options, never);
        assert!(refused(spawned.unwrap_err()));
    }
    for (name, options) in [
        (
            "poll_interval",
            TimerWorkerOptions::default().poll_interval(Duration::ZERO),
        ),
        ("batch_size", TimerWorkerOptions::default().batch_size(0)),
    ] {
        let error = timers.spawn_worker(options, never).unwrap_err();
        assert!(
            matches!(error, TimerError::InvalidOption { option, .. } if option == name),
            "{error}"
        );
    }
    let untouched = row(&timers, "t-1").await;
    assert_eq!(
        (untouched.status, untouched.attempts),
        (TimerStatus::Scheduled, 0)
    );
    assert!(TimerWorkerOptions::default().validate().is_ok());
    assert!(TimerWorkerOptions::default()
        .max_attempts(Some(1))
        .requeue_stuck_after(None)
        .validate()
        .is_ok());
}

async fn worker_loop_fires_each_timer_exactly_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let now = SystemTime::now();
    // Half due already, half due within the next second.
    let requests: Vec<TimerRequest> = (0..60)
        .map(|i| {
            let at = if i % 2 == 0 {
                now - Duration::from_secs(1)
            } else {
                now + Duration::from_millis(20 * i)
            };
            TimerRequest::new(format!("t-{i:02}"), PM, "order", at)
        })
        .collect();
    schedule_all(&timers, &requests).await;
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let worker = timers
        .spawn_worker(
            TimerWorkerOptions::default()
                .poll_interval(Duration::from_millis(100))
                .batch_size(7),
            counting(&counts),
        )
        .unwrap();
    wait_for("60 fires", || counts.lock().unwrap().len() == 60).await;
    worker.shutdown().await;
    let counts = counts.lock().unwrap().clone();
    assert!(counts.values().all(|&n| n == 1), "exactly once: {counts:?}");
    for request in &requests {
        let stored = row(&timers, request.id.as_str()).await;
        assert_eq!(stored.status, TimerStatus::Fired);
        assert_eq!(stored.attempts, 1);
        assert_eq!(stored.event_id, Some(format!("ev-{}", request.id)));
        assert!(stored.claimed_at.unwrap() >= request.fire_at - Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------
// A SIGKILLed worker process

const CHILD: &str = env!("CARGO_BIN_EXE_timer_worker");

fn child(db: &TestDb, effects: &std::path::Path, block: bool, ttl_ms: u64) -> Child {
    Command::new(CHILD)
        .arg(effects)
        .env("KEIRO_DATABASE_URL", &db.url)
        .env("TIMER_TTL_MS", ttl_ms.to_string())
        .env("TIMER_BLOCK", if block { "1" } else { "0" })
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the timer_worker child")
}

/// Reads the child's stdout until a line starting with `prefix`.
async fn line_starting(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("read child stdout") {
            if line.starts_with(prefix) {
                return line;
            }
        }
        panic!("child exited without printing `{prefix}`");
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("child printed no `{prefix}` within 60 s"))
}

async fn killed_worker_fires_again_after_the_stale_ttl(backend: Backend) {
    const TTL_MS: u64 = 1_500;
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    schedule(&timers, past("crash-1")).await;

    let mut first = child(&db, &effects, true, TTL_MS);
    assert_eq!(
        line_starting(&mut first, "FIRING").await,
        "FIRING crash-1 1"
    );
    first.kill().await.expect("SIGKILL the worker mid-fire");
    let stranded = row(&timers, "crash-1").await;
    assert_eq!(
        (stranded.status, stranded.attempts),
        (TimerStatus::Firing, 1)
    );
    let first_claim = stranded.claimed_at.unwrap();

    let mut second = child(&db, &effects, false, TTL_MS);
    assert_eq!(line_starting(&mut second, "FIRED").await, "FIRED crash-1 2");
    // FIRED is printed inside the fire action; the mark follows it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fired = loop {
        let now = row(&timers, "crash-1").await;
        if now.status != TimerStatus::Firing || Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    second.kill().await.unwrap();
    assert_eq!(fired.status, TimerStatus::Fired);
    assert_eq!(fired.attempts, 2);
    assert_eq!(fired.event_id.as_deref(), Some("ev-crash-1-2"));
    let waited = fired
        .claimed_at
        .unwrap()
        .duration_since(first_claim)
        .unwrap();
    assert!(
        waited >= Duration::from_millis(TTL_MS),
        "fired again only after the stale TTL (waited {waited:?})"
    );
    let effects = std::fs::read_to_string(&effects).unwrap();
    assert_eq!(
        effects, "crash-1 1\ncrash-1 2\n",
        "at least once: twice here"
    );
}

// ---------------------------------------------------------------------------
// Inspection

async fn pages_visit_every_timer_once_with_inserts_between(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let base = SystemTime::now() + Duration::from_secs(3600);
    let requests: Vec<TimerRequest> = (0..45)
        .map(|i| {
            // Three timers share each fire time: ties are paged by id.
            TimerRequest::new(
                format!("t-{i:02}"),
                PM,
                "o",
                base + Duration::from_secs(i / 3),
            )
        })
        .collect();
    schedule_all(&timers, &requests).await;

    let mut seen = Vec::new();
    let mut request = TimerPageRequest::first(8);
    let mut pages = 0;
    loop {
        let page = timers.pending(&request).await.unwrap();
        assert!(page.items.len() <= 8);
        seen.extend(page.items.iter().map(|t| t.id.to_string()));
        pages += 1;
        // Between pages: one timer sorting before the cursor, one after all.
        schedule(
            &timers,
            TimerRequest::new(
                format!("early-{pages}"),
                PM,
                "o",
                base - Duration::from_secs(10),
            ),
        )
        .await;
        schedule(
            &timers,
            TimerRequest::new(
                format!("late-{pages}"),
                PM,
                "o",
                base + Duration::from_secs(100 + pages),
            ),
        )
        .await;
        match page.next_cursor {
            Some(cursor) => request = request.after(cursor),
            None => break,
        }
        assert!(pages < 100, "paging must end");
    }
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "no timer twice: {seen:?}");
    let original: Vec<String> = requests.iter().map(|r| r.id.to_string()).collect();
    let seen_original: Vec<&String> = seen.iter().filter(|id| id.starts_with("t-")).collect();
    assert_eq!(seen_original.len(), 45);
    assert!(
        seen_original.iter().zip(&original).all(|(a, b)| *a == b),
        "in (fire_at, id) order"
    );
    assert!(!seen.iter().any(|id| id.starts_with("early-")));
    // Every "late" timer but the one added after the last page was picked up.
    assert_eq!(
        seen.iter().filter(|id| id.starts_with("late-")).count(),
        pages as usize - 1
    );
}

async fn bad_page_requests_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    for limit in [0, MAX_PAGE_LIMIT + 1] {
        let error = timers
            .pending(&TimerPageRequest::first(limit))
            .await
            .unwrap_err();
        assert!(
            matches!(error, TimerError::InvalidPageLimit { limit: l, max } if l == limit && max == MAX_PAGE_LIMIT),
            "{error}"
        );
    }
    assert!(timers
        .pending(&TimerPageRequest::first(MAX_PAGE_LIMIT))
        .await
        .is_ok());
    for cursor in ["", "garbage", "kt1p.12", "kt1p.x.61", "kt1p.1.6"] {
        let error = timers
            .dead(&TimerPageRequest::first(5).after(cursor))
            .await
            .unwrap_err();
        assert!(
            matches!(error, TimerError::MalformedCursor { .. }),
            "{cursor:?}: {error}"
        );
    }
    // A real cursor of one listing refused by another.
    for i in 0..3 {
        schedule(&timers, past(&format!("t-{i}"))).await;
    }
    let cursor = timers
        .pending(&TimerPageRequest::first(1))
        .await
        .unwrap()
        .next_cursor
        .expect("more than one page");
    let error = timers
        .dead(&TimerPageRequest::first(1).after(cursor.clone()))
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        TimerError::WrongCursorKind {
            expected: TimerList::Dead,
            found: TimerList::Pending
        }
    ));
    let error = timers
        .stuck(Duration::ZERO, &TimerPageRequest::first(1).after(cursor))
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        TimerError::WrongCursorKind {
            expected: TimerList::Stuck,
            ..
        }
    ));
}

async fn dead_and_stuck_pages_filter(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let options = TimerWorkerOptions::default().max_attempts(Some(1));
    for (id, pm) in [("a", "billing"), ("b", "shipping"), ("c", "billing")] {
        schedule(
            &timers,
            TimerRequest {
                process_manager: pm.into(),
                ..past(id)
            },
        )
        .await;
    }
    timers
        .drain(&options, 10, |timer: TimerRow| async move {
            if timer.id.as_str() == "b" {
                FireOutcome::failed_permanently("address is unknown")
            } else {
                FireOutcome::retry_later(Duration::ZERO, "busy")
            }
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    timers
        .drain(&options, 10, |_| async { FireOutcome::completed("never") })
        .await
        .unwrap();

    let all = timers.dead(&TimerPageRequest::first(10)).await.unwrap();
    assert_eq!(all.items.len(), 3);
    assert_eq!(all.next_cursor, None);
    let billing = timers
        .dead(&TimerPageRequest::first(10).filter(TimerFilter {
            process_manager: Some("billing".into()),
            reason: None,
        }))
        .await
        .unwrap();
    let ids: BTreeSet<String> = billing.items.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(ids, BTreeSet::from(["a".to_owned(), "c".to_owned()]));
    let ceiling = timers
        .dead(&TimerPageRequest::first(10).filter(TimerFilter {
            process_manager: None,
            reason: Some(TimerReasonFilter::Contains("attempt ceiling".into())),
        }))
        .await
        .unwrap();
    assert_eq!(ceiling.items.len(), 2);
    let exact = timers
        .dead(&TimerPageRequest::first(10).filter(TimerFilter {
            process_manager: Some("shipping".into()),
            reason: Some(TimerReasonFilter::Exact("address is unknown".into())),
        }))
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 1);
    assert_eq!(exact.items[0].id.as_str(), "b");
    assert_eq!(exact.items[0].attempts, 1);

    // Stuck: claimed and never finished.
    for id in ["s-1", "s-2"] {
        schedule(&timers, past(id)).await;
        timers.claim_due().await.unwrap().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stuck = timers
        .stuck(Duration::from_millis(20), &TimerPageRequest::first(1))
        .await
        .unwrap();
    assert_eq!(stuck.items.len(), 1);
    let rest = timers
        .stuck(
            Duration::from_millis(20),
            &TimerPageRequest::first(1).after(stuck.next_cursor.unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_ne!(rest.items[0].id, stuck.items[0].id);
    assert_eq!(rest.next_cursor, None);
    let recent = timers
        .stuck(Duration::from_secs(3600), &TimerPageRequest::first(10))
        .await
        .unwrap();
    assert!(
        recent.items.is_empty(),
        "claims younger than the age are not stuck"
    );
}

// ---------------------------------------------------------------------------
// Guarded resume

const LEASE: Duration = Duration::from_secs(60);

async fn guarded_resume_claim_renew_complete(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let before = dead(&timers, "t-1", "handler refused").await;
    let claim = timers
        .claim_dead(&TimerId::new("t-1"), LEASE)
        .await
        .unwrap();
    assert_eq!(claim.id().as_str(), "t-1");
    let held = row(&timers, "t-1").await;
    assert_eq!(held.status, TimerStatus::Resuming);
    assert_eq!(held.resume_lease_until, claim.lease_until());
    assert_eq!(held.last_error, before.last_error);
    assert_eq!(held.attempts, before.attempts);

    // The token travels as a string (to a later request, another process).
    let token = claim.token();
    let rebuilt = TimerResumeClaim::from_token(&token).unwrap();
    assert_eq!(rebuilt.id(), claim.id());
    let renewed = timers
        .renew_resume(&rebuilt, Duration::from_secs(120))
        .await
        .unwrap();
    assert!(renewed.lease_until().unwrap() > claim.lease_until().unwrap());
    assert_eq!(renewed.token(), token, "renewal keeps the token");

    let done = timers.complete_resume(&renewed, "ev-manual").await.unwrap();
    assert_eq!(done.status, TimerStatus::Fired);
    assert_eq!(done.event_id.as_deref(), Some("ev-manual"));
    assert_eq!(done.resume_lease_until, None);
    let spent = timers
        .complete_resume(&renewed, "ev-again")
        .await
        .unwrap_err();
    assert!(matches!(
        spent,
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Fired),
            ..
        }
    ));
}

async fn guarded_resume_park_and_cancel(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    dead(&timers, "park", "original").await;
    dead(&timers, "cancel", "original").await;

    let claim = timers
        .claim_dead(&TimerId::new("park"), LEASE)
        .await
        .unwrap();
    let parked = timers
        .park_resume(&claim, Some("customer asked to wait"))
        .await
        .unwrap();
    assert_eq!(parked.status, TimerStatus::Dead);
    assert_eq!(parked.last_error.as_deref(), Some("customer asked to wait"));
    assert_eq!(parked.attempts, 1);
    // Parked: dead again, claimable anew; a park without a reason keeps it.
    let again = timers
        .claim_dead(&TimerId::new("park"), LEASE)
        .await
        .unwrap();
    let parked = timers.park_resume(&again, None).await.unwrap();
    assert_eq!(parked.last_error.as_deref(), Some("customer asked to wait"));

    let claim = timers
        .claim_dead(&TimerId::new("cancel"), LEASE)
        .await
        .unwrap();
    let cancelled = timers.cancel_resume(&claim).await.unwrap();
    assert_eq!(cancelled.status, TimerStatus::Cancelled);
    assert!(matches!(
        timers.park_resume(&claim, None).await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Cancelled),
            ..
        }
    ));
}

async fn guarded_resume_refusals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("live")).await;
    assert!(matches!(
        timers
            .claim_dead(&TimerId::new("live"), LEASE)
            .await
            .unwrap_err(),
        TimerError::NotDead {
            status: TimerStatus::Scheduled,
            ..
        }
    ));
    assert!(matches!(
        timers
            .claim_dead(&TimerId::new("missing"), LEASE)
            .await
            .unwrap_err(),
        TimerError::NotFound { .. }
    ));
    timers.cancel(&TimerId::new("live")).await.unwrap();
    dead(&timers, "t-1", "boom").await;
    let id = TimerId::new("t-1");
    for lease in [
        Duration::ZERO,
        keiro::timers::MAX_RESUME_LEASE + Duration::from_secs(1),
    ] {
        assert!(matches!(
            timers.claim_dead(&id, lease).await.unwrap_err(),
            TimerError::InvalidLease { .. }
        ));
    }
    let claim = timers.claim_dead(&id, LEASE).await.unwrap();
    assert!(matches!(
        timers.claim_dead(&id, LEASE).await.unwrap_err(),
        TimerError::HeldForResume { .. }
    ));

    // Id-only mutations refuse a held timer.
    let held = |e: TimerError| matches!(e, TimerError::HeldForResume { ref id, .. } if id == "t-1");
    assert!(held(timers.cancel(&id).await.unwrap_err()));
    assert!(held(timers.requeue(&id).await.unwrap_err()));
    assert!(held(
        timers
            .reschedule(&id, SystemTime::now(), None)
            .await
            .unwrap_err()
    ));
    assert!(held(timers.dead_letter(&id, "x").await.unwrap_err()));
    assert!(held(timers.mark_fired(&id, "ev").await.unwrap_err()));
    // Workers pass it over.
    let summary = timers
        .drain(&TimerWorkerOptions::default(), 10, |_| async {
            FireOutcome::completed("never")
        })
        .await
        .unwrap();
    assert_eq!(summary.processed, 0);

    // A forged token holds nothing.
    let forged = TimerResumeClaim::from_token(&claim.token().replacen('.', ".x", 1)).unwrap();
    assert!(matches!(
        timers.complete_resume(&forged, "ev").await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Resuming),
            ..
        }
    ));
    assert!(matches!(
        TimerResumeClaim::from_token("not a token").unwrap_err(),
        TimerError::MalformedResumeToken { .. }
    ));
    assert_eq!(row(&timers, "t-1").await.status, TimerStatus::Resuming);
    timers.cancel_resume(&claim).await.unwrap();
}

async fn expired_resume_claims_recover_to_dead_in_a_worker_pass(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let before = dead(&timers, "t-1", "handler refused").await;
    let claim = timers
        .claim_dead(&TimerId::new("t-1"), Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Lapsed: the holder can no longer act, even before any sweep.
    assert!(matches!(
        timers.renew_resume(&claim, LEASE).await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Resuming),
            ..
        }
    ));
    // A worker with ordinary recovery off still sweeps it back to dead.
    let summary = timers
        .drain(&no_requeue(), 10, |_| async {
            FireOutcome::completed("never")
        })
        .await
        .unwrap();
    assert_eq!((summary.recovered_resumes, summary.processed), (1, 0));
    let recovered = row(&timers, "t-1").await;
    assert_eq!(recovered.status, TimerStatus::Dead);
    assert_eq!(recovered.last_error, before.last_error);
    assert_eq!(recovered.attempts, before.attempts);
    assert_eq!(recovered.resume_lease_until, None);
    assert!(matches!(
        timers.complete_resume(&claim, "ev").await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Dead),
            ..
        }
    ));
    // And the standalone sweep finds nothing left.
    assert_eq!(timers.recover_expired_resumes().await.unwrap(), 0);
}

async fn id_only_mutations_by_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    // Reschedule a claimed timer in one call.
    schedule(&timers, past("t-1")).await;
    let claimed = timers.claim_due().await.unwrap().unwrap();
    let later = SystemTime::now() + Duration::from_secs(600);
    let TimerChange::Applied(moved) = timers
        .reschedule(&claimed.id, later, Some("moved by hand"))
        .await
        .unwrap()
    else {
        panic!("a claimed timer can be rescheduled")
    };
    assert_eq!((moved.status, moved.attempts), (TimerStatus::Scheduled, 1));
    assert_eq!(moved.last_error.as_deref(), Some("moved by hand"));
    assert_eq!(timers.count_due().await.unwrap(), 0);

    // Requeue a dead timer: a fresh attempt budget.
    dead(&timers, "t-2", "gave up").await;
    let TimerChange::Applied(requeued) = timers.requeue(&TimerId::new("t-2")).await.unwrap() else {
        panic!("a dead timer can be requeued")
    };
    assert_eq!(
        (requeued.status, requeued.attempts),
        (TimerStatus::Scheduled, 0)
    );

    assert_eq!(
        timers.mark_fired(&TimerId::new("t-2"), "ev").await.unwrap(),
        TimerChange::NotApplicable(TimerStatus::Scheduled)
    );
    assert_eq!(
        timers.cancel(&TimerId::new("missing")).await.unwrap(),
        TimerChange::NotFound
    );
    assert!(timers
        .cancel(&TimerId::new("t-2"))
        .await
        .unwrap()
        .is_applied());
    assert_eq!(
        timers.requeue(&TimerId::new("t-2")).await.unwrap(),
        TimerChange::NotApplicable(TimerStatus::Cancelled)
    );
}

// ---------------------------------------------------------------------------
// PostgreSQL: four drainers, one table

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_concurrent_drainers_fire_each_of_1000_timers_exactly_once() {
    let db = TestDb::new(Backend::Postgres).await;
    let setup = timers(&db).await;
    let requests: Vec<TimerRequest> = (0..1000).map(|i| past(&format!("t-{i:04}"))).collect();
    schedule_all(&setup, &requests).await;

    let counts = Arc::new(Mutex::new(HashMap::new()));
    let mut drainers = Vec::new();
    for _ in 0..4 {
        // Each drainer has its own pool, as a separate process would.
        let own = timers(&db).await;
        let fire = counting(&counts);
        drainers.push(tokio::spawn(async move {
            let mut total = 0;
            loop {
                let summary = own
                    .drain(&TimerWorkerOptions::default(), 50, &fire)
                    .await
                    .unwrap();
                total += summary.processed;
                if summary.processed == 0 {
                    break total;
                }
            }
        }));
    }
    let mut per_drainer = Vec::new();
    for drainer in drainers {
        per_drainer.push(drainer.await.unwrap());
    }
    assert_eq!(per_drainer.iter().sum::<usize>(), 1000, "{per_drainer:?}");
    let counts = counts.lock().unwrap().clone();
    assert_eq!(counts.len(), 1000);
    assert!(counts.values().all(|&n| n == 1), "each fired exactly once");
    assert_eq!(setup.count_due().await.unwrap(), 0);
    let fired = setup.pending(&TimerPageRequest::first(10)).await.unwrap();
    assert!(fired.items.is_empty());
}

// ---------------------------------------------------------------------------
// Benchmark (not a test): `cargo test --release -p keiro-tests --test timers
// -- --ignored --nocapture bench_timers`

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark: prints JSON lines, asserts nothing about speed"]
async fn bench_timers() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let name = match backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        };
        let emit = |workload: &str, value: f64, unit: &str| {
            println!(
                "{}",
                serde_json::json!({
                    "system": "keiro", "backend": name, "workload": workload,
                    "value": (value * 10.0).round() / 10.0, "unit": unit,
                })
            );
        };

        // Drain throughput: one drainer over 5,000 due timers.
        const N: usize = 5_000;
        let db = TestDb::new(backend).await;
        let timers = timers(&db).await;
        let requests: Vec<TimerRequest> = (0..N).map(|i| past(&format!("t-{i:05}"))).collect();
        schedule_all(&timers, &requests).await;
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let started = Instant::now();
        let summary = timers
            .drain(&TimerWorkerOptions::default(), N, counting(&counts))
            .await
            .unwrap();
        assert_eq!(summary.fired, N);
        emit(
            "timer_drain",
            N as f64 / started.elapsed().as_secs_f64(),
            "timers/s",
        );

        // Four drainers with their own pools.
        let requests: Vec<TimerRequest> = (0..N).map(|i| past(&format!("u-{i:05}"))).collect();
        schedule_all(&timers, &requests).await;
        let started = Instant::now();
        let mut drainers = Vec::new();
        for _ in 0..4 {
            let own = self::timers(&db).await;
            let fire = counting(&counts);
            drainers.push(tokio::spawn(async move {
                while own
                    .drain(&TimerWorkerOptions::default(), 256, &fire)
                    .await
                    .unwrap()
                    .processed
                    > 0
                {}
            }));
        }
        for drainer in drainers {
            drainer.await.unwrap();
        }
        emit(
            "timer_drain_4_workers",
            N as f64 / started.elapsed().as_secs_f64(),
            "timers/s",
        );

        // Fire lag: a worker loop (1 s poll) and 300 timers due over 3.5 s.
        let lags = Arc::new(Mutex::new(Vec::new()));
        let recorder = lags.clone();
        let worker = timers
            .spawn_worker(TimerWorkerOptions::default(), move |timer: TimerRow| {
                let lag = SystemTime::now()
                    .duration_since(timer.fire_at)
                    .unwrap_or_default();
                recorder.lock().unwrap().push(lag.as_secs_f64() * 1000.0);
                std::future::ready(FireOutcome::completed("ev"))
            })
            .unwrap();
        // Scheduled one by one while the worker idles, as a process
        // manager would: each schedule wakes it to re-check the earliest
        // fire time.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = SystemTime::now();
        for i in 0..300u64 {
            let at = now + Duration::from_millis(500 + i * 10);
            timers
                .schedule(&TimerRequest::new(format!("lag-{i:03}"), PM, "o", at))
                .await
                .unwrap();
        }
        wait_for("300 lag fires", || lags.lock().unwrap().len() == 300).await;
        worker.shutdown().await;
        let mut lags = lags.lock().unwrap().clone();
        lags.sort_by(f64::total_cmp);
        emit("timer_fire_lag_p50", lags[lags.len() / 2], "ms");
        emit("timer_fire_lag_p99", lags[lags.len() * 99 / 100], "ms");
    }
}
