//! Firing durable timers, on both backends: each fire outcome, a panicking
//! fire action, the attempt ceiling, `drain` limits, stale claims, option
//! validation, the worker loop, a SIGKILLed worker process, and (on
//! PostgreSQL) four concurrent drainers. `bench_timers` (ignored) prints
//! throughput and lag.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use keiro::timers::{
    DrainSummary, FireDisposition, FireOutcome, TimerError, TimerPageRequest, TimerRequest,
    TimerRow, TimerStatus, TimerWorkerOptions, NOT_MINE_RETRY_DELAY, PANIC_RETRY_DELAY,
};
use keiro_tests::timers::{counting, no_requeue, past, row, schedule, schedule_all, timers, PM};
use keiro_tests::{on_both_backends, Backend, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

on_both_backends!(
    each_fire_outcome_is_applied,
    a_panicking_fire_action_is_retried,
    an_outcome_for_a_timer_that_moved_on_is_dropped,
    attempt_ceiling_dead_letters_at_the_documented_count,
    drain_respects_its_limit_and_cannot_spin,
    stale_claims_are_requeued_by_the_next_pass,
    option_validation_refuses_before_anything_runs,
    worker_loop_fires_each_timer_exactly_once,
    a_slow_fire_action_does_not_hold_up_other_timers,
    the_worker_fires_at_most_its_concurrency_at_once,
    a_worker_never_requeues_its_own_fire_in_flight,
    killed_worker_fires_again_after_the_stale_ttl,
);

// ---------------------------------------------------------------------------
// A timer whose stored text does not decode (SQLite only: PostgreSQL's `JSON`
// column refuses such text however it is written; SQLite's CHECK can be
// switched off)

/// Schedules `bad` (due first) and `good` due now, then breaks `bad`'s
/// payload by hand, as a bad migration or a hand edit would.
async fn with_one_undecodable(timers: &keiro::timers::Timers, bad: &str, good: &[&str]) {
    let mut request = past(bad);
    request.fire_at -= Duration::from_secs(60);
    schedule(timers, request).await;
    let requests: Vec<TimerRequest> = good.iter().map(|id| past(id)).collect();
    schedule_all(timers, &requests).await;
    let keiro_tests::timers::Pool::Sqlite(pool) = keiro_tests::timers::pool(timers) else {
        unreachable!("an SQLite test database")
    };
    // The table's CHECK refuses such text: only a write that switches the
    // check off (or a damaged file) can store it.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("PRAGMA ignore_check_constraints = ON")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("UPDATE keiro_timers SET payload = '{not json' WHERE id = ?")
        .bind(bad)
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("PRAGMA ignore_check_constraints = OFF")
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// The stored status and last error of timer `id`, read without decoding it.
async fn raw_status(timers: &keiro::timers::Timers, id: &str) -> (String, Option<String>) {
    let keiro_tests::timers::Pool::Sqlite(pool) = keiro_tests::timers::pool(timers) else {
        unreachable!("an SQLite test database")
    };
    sqlx::query_as("SELECT status, last_error FROM keiro_timers WHERE id = ?")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_undecodable_timer_is_set_aside_and_the_worker_goes_on() {
    let db = TestDb::new(Backend::Sqlite).await;
    let timers = timers(&db).await;
    with_one_undecodable(&timers, "bad", &["g-1", "g-2", "g-3"]).await;
    let counts = Arc::new(Mutex::new(HashMap::new()));
    // A poll interval far longer than the wait below: a loop that paused
    // after setting the bad timer aside would not fire the others in time.
    let worker = timers
        .spawn_worker(
            TimerWorkerOptions::default().poll_interval(Duration::from_secs(600)),
            counting(&counts),
        )
        .unwrap();
    let started = Instant::now();
    wait_for("the three good fires", || counts.lock().unwrap().len() == 3).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    worker.shutdown().await;
    assert!(!counts.lock().unwrap().contains_key("bad"));
    let (status, reason) = raw_status(&timers, "bad").await;
    assert_eq!(status, "dead");
    let reason = reason.unwrap();
    assert!(
        reason.contains("timer `bad` does not decode"),
        "the reason names the timer: {reason}"
    );
}

#[tokio::test]
async fn drain_sets_an_undecodable_timer_aside_and_fires_the_rest() {
    let db = TestDb::new(Backend::Sqlite).await;
    let timers = timers(&db).await;
    with_one_undecodable(&timers, "bad", &["g-1", "g-2"]).await;
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let summary = timers
        .drain(&TimerWorkerOptions::default(), 10, counting(&counts))
        .await
        .unwrap();
    assert_eq!(
        (summary.processed, summary.undecodable, summary.fired),
        (3, 1, 2),
        "{summary:?}"
    );
    assert_eq!(counts.lock().unwrap().len(), 2);
    assert_eq!(raw_status(&timers, "bad").await.0, "dead");
    // `run_once` returns the error, naming the timer, and sets it aside too.
    with_one_undecodable(&timers, "bad-2", &[]).await;
    let error = timers
        .run_once(&TimerWorkerOptions::default(), counting(&counts))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, TimerError::Payload { id, .. } if id == "bad-2"),
        "{error:?}"
    );
    assert_eq!(raw_status(&timers, "bad-2").await.0, "dead");
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
        ("concurrency", TimerWorkerOptions::default().concurrency(0)),
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

async fn a_slow_fire_action_does_not_hold_up_other_timers(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    // One timer whose fire action hangs until released, due now; five more
    // due a little later.
    schedule(&timers, past("slow")).await;
    let later = SystemTime::now() + Duration::from_millis(300);
    let requests: Vec<TimerRequest> = (0..5)
        .map(|i| TimerRequest::new(format!("quick-{i}"), PM, "order", later))
        .collect();
    schedule_all(&timers, &requests).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let fired: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let fire = {
        let (release, fired) = (release.clone(), fired.clone());
        move |timer: TimerRow| {
            let (release, fired) = (release.clone(), fired.clone());
            async move {
                if timer.id.as_str() == "slow" {
                    release.notified().await;
                }
                let id = timer.id.to_string();
                fired.lock().unwrap().push((id.clone(), Instant::now()));
                FireOutcome::completed(format!("ev-{id}"))
            }
        }
    };
    let started = Instant::now();
    let worker = timers
        .spawn_worker(
            TimerWorkerOptions::default().poll_interval(Duration::from_millis(100)),
            fire,
        )
        .unwrap();
    wait_for("the five quick fires", || fired.lock().unwrap().len() == 5).await;
    // A worker that fired one timer at a time would still be waiting on the
    // slow one here: its fire action has not been released.
    let quick = fired.lock().unwrap().clone();
    assert!(
        quick.iter().all(|(id, _)| id.starts_with("quick-")),
        "{quick:?}"
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the quick timers waited {took:?}"
    );
    assert_eq!(row(&timers, "slow").await.status, TimerStatus::Firing);
    release.notify_one();
    wait_for("the slow fire", || fired.lock().unwrap().len() == 6).await;
    worker.shutdown().await;
    for id in ["slow", "quick-0", "quick-4"] {
        let stored = row(&timers, id).await;
        assert_eq!(
            (stored.status, stored.attempts),
            (TimerStatus::Fired, 1),
            "{id}"
        );
    }
}

async fn the_worker_fires_at_most_its_concurrency_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let requests: Vec<TimerRequest> = (0..12).map(|i| past(&format!("t-{i:02}"))).collect();
    schedule_all(&timers, &requests).await;
    let (now, most) = (Arc::new(Mutex::new(0usize)), Arc::new(Mutex::new(0usize)));
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let fire = {
        let (now, most, counts) = (now.clone(), most.clone(), counts.clone());
        move |timer: TimerRow| {
            let (now, most, counts) = (now.clone(), most.clone(), counts.clone());
            async move {
                {
                    let mut now = now.lock().unwrap();
                    *now += 1;
                    let mut most = most.lock().unwrap();
                    *most = (*most).max(*now);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                *now.lock().unwrap() -= 1;
                *counts
                    .lock()
                    .unwrap()
                    .entry(timer.id.to_string())
                    .or_insert(0) += 1;
                FireOutcome::completed(format!("ev-{}", timer.id))
            }
        }
    };
    let worker = timers
        .spawn_worker(TimerWorkerOptions::default().concurrency(3), fire)
        .unwrap();
    wait_for("12 fires", || counts.lock().unwrap().len() == 12).await;
    worker.shutdown().await;
    assert!(counts.lock().unwrap().values().all(|&n| n == 1));
    // Twelve fires of 100 ms, three at a time: exactly three ran at once.
    assert_eq!(*most.lock().unwrap(), 3);
}

async fn a_worker_never_requeues_its_own_fire_in_flight(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("long")).await;
    let calls = Arc::new(Mutex::new(0u32));
    let release = Arc::new(tokio::sync::Notify::new());
    let fire = {
        let (calls, release) = (calls.clone(), release.clone());
        move |timer: TimerRow| {
            let (calls, release) = (calls.clone(), release.clone());
            async move {
                *calls.lock().unwrap() += 1;
                release.notified().await;
                FireOutcome::completed(format!("ev-{}", timer.id))
            }
        }
    };
    // Stale after 100 ms, and the preamble runs every 50 ms: the fire below
    // runs ten times as long.
    let worker = timers
        .spawn_worker(
            TimerWorkerOptions::default()
                .requeue_stuck_after(Duration::from_millis(100))
                .poll_interval(Duration::from_millis(50)),
            fire,
        )
        .unwrap();
    wait_for("the fire", || *calls.lock().unwrap() == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Still the one claim: the worker's own preamble left it alone, so it
    // never claimed a second copy into another slot.
    assert_eq!(*calls.lock().unwrap(), 1);
    let stored = row(&timers, "long").await;
    assert_eq!((stored.status, stored.attempts), (TimerStatus::Firing, 1));
    release.notify_one();
    // Shutdown waits for the fire in flight to end and be recorded.
    worker.shutdown().await;
    let stored = row(&timers, "long").await;
    assert_eq!((stored.status, stored.attempts), (TimerStatus::Fired, 1));
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
// Benchmark (not a test): `cargo test --release -p keiro-tests --test timers_worker
// -- --ignored --nocapture bench_timers`

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark: prints JSON lines, asserts nothing about speed"]
async fn bench_timers() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let name = match backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres | Backend::PgBouncer => "postgres",
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
