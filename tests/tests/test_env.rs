//! `keiro::testing::TestEnv`: a private in-memory runtime whose clock moves
//! only when the test says so. Durable sleeps, `recv` timeouts, workflow
//! deadlines and timers fall due under `advance` at once and in time order,
//! `keiro::now` reads the virtual clock, and two environments share nothing.
//! SQLite only, by definition of `TestEnv`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keiro::testing::TestEnv;
use keiro::timers::{FireOutcome, TimerRequest, TimerRow, TimerWorkerOptions};
use keiro::{step, workflow, Error, WorkflowStatus};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// A fixed start, so recorded times can be compared exactly.
fn epoch() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

/// Sleeps three days, then waits a day for an approval.
#[workflow]
async fn approval(order: String) -> Result<String, String> {
    keiro::sleep(3 * DAY).await;
    let answer = keiro::recv::<bool>("approved")
        .timeout(DAY)
        .await
        .map_err(|e| e.to_string())?;
    Ok(match answer {
        Some(true) => format!("{order}: approved"),
        Some(false) => format!("{order}: refused"),
        None => format!("{order}: no answer"),
    })
}

#[tokio::test]
async fn a_three_day_sleep_then_a_one_day_recv_timeout_takes_the_timeout_branch() {
    let wall = Instant::now();
    let env = TestEnv::new().await;
    let start = env.now();
    let handle = env.start(approval("o-1".into()).id("o-1")).await.unwrap();

    env.advance(3 * DAY).await;
    assert_eq!(env.now(), start + 3 * DAY);
    assert_eq!(
        handle.status().await.unwrap(),
        WorkflowStatus::Suspended,
        "after the sleep the workflow waits for the message"
    );
    env.advance(DAY).await;
    assert_eq!(env.now(), start + 4 * DAY);

    assert_eq!(handle.result().await.unwrap(), Ok("o-1: no answer".into()));
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "took {:?}",
        wall.elapsed()
    );
}

#[tokio::test]
async fn a_message_sent_after_the_sleep_takes_the_message_branch() {
    let wall = Instant::now();
    let env = TestEnv::new().await;
    let start = env.now();
    let handle = env.start(approval("o-2".into()).id("o-2")).await.unwrap();

    env.advance(3 * DAY).await;
    env.keiro().send("o-2", "approved", &true).await.unwrap();
    env.advance(Duration::ZERO).await;

    assert_eq!(handle.result().await.unwrap(), Ok("o-2: approved".into()));
    assert_eq!(env.now(), start + 3 * DAY, "no time passed for the answer");
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "took {:?}",
        wall.elapsed()
    );
}

#[tokio::test]
async fn nothing_falls_due_before_its_time() {
    let env = TestEnv::new().await;
    let handle = env.start(approval("o-3".into()).id("o-3")).await.unwrap();
    env.advance(3 * DAY - Duration::from_secs(1)).await;
    env.keiro().send("o-3", "approved", &false).await.unwrap();
    env.advance(Duration::ZERO).await;
    assert_eq!(
        handle.status().await.unwrap(),
        WorkflowStatus::Suspended,
        "a second before the sleep ends, the message waits"
    );
    env.advance(Duration::from_secs(1)).await;
    assert_eq!(handle.result().await.unwrap(), Ok("o-3: refused".into()));
}

/// When each `alarm` woke, by tag: (tag, keiro::now() after its sleep).
static WOKEN: Mutex<Vec<(String, SystemTime)>> = Mutex::new(Vec::new());

#[step]
async fn note_woken(tag: String, at: SystemTime) -> bool {
    WOKEN.lock().unwrap().push((tag, at));
    true
}

/// Sleeps `hours`, then notes when it woke.
#[workflow]
async fn alarm(tag: String, hours: u64) -> Result<SystemTime, String> {
    keiro::sleep(HOUR * hours as u32).await;
    let at = keiro::now().await;
    note_woken(tag, at).await;
    Ok(at)
}

fn woken(prefix: &str) -> Vec<(String, SystemTime)> {
    WOKEN
        .lock()
        .unwrap()
        .iter()
        .filter(|(tag, _)| tag.starts_with(prefix))
        .cloned()
        .collect()
}

#[tokio::test]
async fn sleeps_falling_due_within_one_advance_wake_in_time_order_at_their_due_times() {
    let env = TestEnv::starting_at(epoch()).await;
    // The later one first, so start order is not wake order.
    let late = env
        .start(alarm("order/late".into(), 2).id("late"))
        .await
        .unwrap();
    let early = env
        .start(alarm("order/early".into(), 1).id("early"))
        .await
        .unwrap();

    env.advance(3 * HOUR).await;

    assert_eq!(
        woken("order/"),
        vec![
            ("order/early".to_owned(), epoch() + HOUR),
            ("order/late".to_owned(), epoch() + 2 * HOUR),
        ],
        "each woke at its own due time, the earlier first"
    );
    assert_eq!(early.result().await.unwrap(), Ok(epoch() + HOUR));
    assert_eq!(late.result().await.unwrap(), Ok(epoch() + 2 * HOUR));
    assert_eq!(env.now(), epoch() + 3 * HOUR);
}

/// Returns the time it starts at.
#[workflow]
async fn what_time() -> Result<SystemTime, String> {
    Ok(keiro::now().await)
}

#[tokio::test]
async fn keiro_now_in_a_workflow_reads_the_virtual_clock() {
    let env = TestEnv::starting_at(epoch()).await;
    assert_eq!(env.run(what_time()).await.unwrap(), Ok(epoch()));
    env.advance(DAY).await;
    assert_eq!(env.run(what_time()).await.unwrap(), Ok(epoch() + DAY));
}

#[tokio::test]
async fn run_skips_time_to_each_wake_until_the_workflow_ends() {
    let wall = Instant::now();
    let env = TestEnv::starting_at(epoch()).await;
    let out = env.run(approval("o-4".into()).id("o-4")).await.unwrap();
    assert_eq!(out, Ok("o-4: no answer".into()));
    assert_eq!(env.now(), epoch() + 4 * DAY, "the sleep, then the timeout");
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "took {:?}",
        wall.elapsed()
    );
}

#[tokio::test]
async fn a_workflow_deadline_fires_under_advance() {
    let env = TestEnv::starting_at(epoch()).await;
    let handle = env
        .start(alarm("deadline/a".into(), 48).id("deadline-a").timeout(DAY))
        .await
        .unwrap();
    env.advance(DAY - Duration::from_secs(1)).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    env.advance(Duration::from_secs(1)).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::TimedOut);
    assert!(matches!(handle.result().await, Err(Error::TimedOut { .. })));
    env.advance(2 * DAY).await;
    assert_eq!(woken("deadline/"), vec![], "the sleep never ended the run");
}

#[tokio::test]
async fn two_environments_are_independent() {
    let (one, two) = (
        TestEnv::starting_at(epoch()).await,
        TestEnv::starting_at(epoch()).await,
    );
    // The same id in both: each has its own database.
    let first = one
        .start(alarm("two/one".into(), 1).id("same"))
        .await
        .unwrap();
    let second = two
        .start(alarm("two/two".into(), 1).id("same"))
        .await
        .unwrap();

    one.advance(HOUR).await;
    assert_eq!(one.now(), epoch() + HOUR);
    assert_eq!(two.now(), epoch(), "advancing one moved the other");
    assert_eq!(first.result().await.unwrap(), Ok(epoch() + HOUR));
    assert_eq!(second.status().await.unwrap(), WorkflowStatus::Suspended);

    two.advance(HOUR).await;
    assert_eq!(second.result().await.unwrap(), Ok(epoch() + HOUR));
}

#[tokio::test]
async fn timers_fire_under_advance_in_order_at_their_fire_times() {
    let env = TestEnv::starting_at(epoch()).await;
    let fired: Arc<Mutex<Vec<(String, SystemTime)>>> = Arc::default();
    let timers = env.keiro().timers();
    for (id, hours) in [("t-late", 2), ("t-early", 1)] {
        let request = TimerRequest::new(id, "test", id, env.now() + HOUR * hours);
        timers.schedule(&request).await.unwrap();
    }
    let record = fired.clone();
    let worker = timers
        .spawn_worker(TimerWorkerOptions::default(), move |timer: TimerRow| {
            let record = record.clone();
            async move {
                record
                    .lock()
                    .unwrap()
                    .push((timer.id.as_str().to_owned(), timer.fire_at));
                FireOutcome::completed(format!("fired:{}", timer.id.as_str()))
            }
        })
        .unwrap();

    env.advance(HOUR - Duration::from_secs(1)).await;
    assert!(fired.lock().unwrap().is_empty(), "nothing is due yet");
    env.advance(2 * HOUR).await;
    assert_eq!(
        *fired.lock().unwrap(),
        vec![
            ("t-early".to_owned(), epoch() + HOUR),
            ("t-late".to_owned(), epoch() + 2 * HOUR),
        ]
    );
    worker.shutdown().await;
}

/// A message against a two-day sleep.
#[workflow]
async fn message_or_sleep() -> Result<String, String> {
    Ok(keiro::select! {
        m = keiro::recv::<String>("go") => m.map_err(|e| e.to_string())?,
        _ = keiro::sleep(2 * DAY) => "slept".to_owned(),
    })
}

#[tokio::test]
async fn a_select_between_a_message_and_a_sleep_obeys_the_virtual_clock() {
    let wall = Instant::now();
    let env = TestEnv::starting_at(epoch()).await;
    let sleeper = env.start(message_or_sleep().id("sleeper")).await.unwrap();
    let listener = env.start(message_or_sleep().id("listener")).await.unwrap();
    env.advance(DAY).await;
    env.keiro().send("listener", "go", "message").await.unwrap();
    env.advance(DAY).await;
    assert_eq!(listener.result().await.unwrap(), Ok("message".into()));
    assert_eq!(sleeper.result().await.unwrap(), Ok("slept".into()));
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "took {:?}",
        wall.elapsed()
    );
}

/// Waits up to an hour for an awakeable.
#[workflow]
async fn answer_within_an_hour() -> Result<Option<u32>, String> {
    let awakeable = keiro::awakeable::<u32>().await;
    awakeable.timeout(HOUR).await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_awakeable_timeout_falls_due_under_advance() {
    let env = TestEnv::starting_at(epoch()).await;
    let handle = env.start(answer_within_an_hour().id("aw")).await.unwrap();
    env.advance(HOUR - Duration::from_secs(1)).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    env.advance(Duration::from_secs(1)).await;
    assert_eq!(handle.result().await.unwrap(), Ok(None));
}

keiro::queue!(ENV_QUEUE = "test-env-queue", concurrency = 1);

#[workflow]
async fn enqueued_in_a_transaction(n: u32) -> u32 {
    n
}

/// The order [`noted`] instances started in.
static STARTED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[step]
async fn note_start(n: u32) -> u32 {
    STARTED.lock().unwrap().push(n);
    n
}

#[workflow]
async fn noted(n: u32) -> u32 {
    note_start(n).await
}

/// While the virtual clock stands still, enqueues made one after another (a
/// commit each) still run in the order they were made, not in id order:
/// each is created after the one before.
#[tokio::test]
async fn a_queue_runs_enqueues_in_the_order_made_while_the_clock_stands_still() {
    let env = TestEnv::starting_at(epoch()).await;
    let mut handles = Vec::new();
    for n in 0..10u32 {
        // Ids falling as they are made; all due at once, an hour on.
        let call = noted(n).id(format!("made-{}", 9 - n)).queue(&ENV_QUEUE);
        let handle = call.delay(HOUR).on(env.keiro()).enqueue().await.unwrap();
        handles.push(handle);
    }
    env.advance(HOUR).await;
    for handle in handles {
        handle.result().await.unwrap();
    }
    assert_eq!(*STARTED.lock().unwrap(), (0..10).collect::<Vec<u32>>());
}

/// An instance enqueued in the caller's transaction is created at the
/// environment's virtual time, like one enqueued on its own, on a queue or
/// not: a queue runs its instances in order of creation.
#[tokio::test]
async fn an_enqueue_in_a_transaction_is_created_at_the_virtual_time() {
    let env = TestEnv::starting_at(epoch()).await;
    env.advance(HOUR).await;
    let keiro_store::Store::Sqlite(store) = keiro::unstable::raw_store(env.keiro()) else {
        unreachable!("a TestEnv runs on SQLite");
    };
    let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    enqueued_in_a_transaction(1)
        .id("plain")
        .on(env.keiro())
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    enqueued_in_a_transaction(2)
        .id("queued")
        .queue(&ENV_QUEUE)
        .on(env.keiro())
        .enqueue_tx(&mut tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let expected = (epoch() + HOUR).duration_since(UNIX_EPOCH).unwrap();
    for id in ["plain", "queued"] {
        let row = keiro::unstable::raw_store(env.keiro())
            .get_instance(id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.created_at, expected.as_micros() as i64, "{id}");
    }
}

/// Awakeable ids published by [`answer_published`].
static PUBLISHED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Makes an id known outside the workflow.
#[step]
async fn publish(id: String) -> Result<(), String> {
    PUBLISHED.lock().unwrap().push(id);
    Ok(())
}

/// Publishes its awakeable's id, then waits up to an hour for the answer.
#[workflow]
async fn answer_published() -> Result<Option<u32>, String> {
    let awakeable = keiro::awakeable::<u32>().await;
    publish(awakeable.id().to_owned()).await?;
    awakeable.timeout(HOUR).await.map_err(|e| e.to_string())
}

/// `future`'s output, if it comes within a few seconds of wall time.
async fn within_seconds<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(5), future)
        .await
        .expect("the workflow goes on without time advanced")
}

/// The environment's SQLite pool, for a transaction of the caller's own.
fn pool_of(env: &TestEnv) -> sqlx::SqlitePool {
    let keiro_store::Store::Sqlite(store) = keiro::unstable::raw_store(env.keiro()) else {
        unreachable!("a TestEnv runs on SQLite");
    };
    store.pool().clone()
}

/// A message sent and an awakeable answered in the caller's transaction
/// through the environment's runtime make their workflows due at the
/// virtual time, which is years before the wall clock here: both go on at
/// once, with no time advanced.
#[tokio::test]
async fn sends_and_answers_in_a_transaction_are_due_at_the_virtual_time() {
    let env = TestEnv::starting_at(epoch()).await;
    let handle = env.start(approval("o-tx".into()).id("o-tx")).await.unwrap();
    env.advance(3 * DAY).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    let mut tx = pool_of(&env).begin_with("BEGIN IMMEDIATE").await.unwrap();
    env.keiro()
        .send_tx(&mut tx, "o-tx", "approved", &true)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    env.advance(Duration::ZERO).await;
    assert_eq!(
        within_seconds(handle.result()).await.unwrap(),
        Ok("o-tx: approved".into())
    );
    assert_eq!(
        env.now(),
        epoch() + 3 * DAY,
        "no time passed for the answer"
    );

    let handle = env.start(answer_published().id("aw-tx")).await.unwrap();
    env.advance(Duration::ZERO).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    let id = PUBLISHED.lock().unwrap().pop().expect("the awakeable's id");
    let mut tx = pool_of(&env).begin_with("BEGIN IMMEDIATE").await.unwrap();
    env.keiro()
        .resolve_awakeable_tx(&mut tx, &id, &7_u32)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    env.advance(Duration::ZERO).await;
    assert_eq!(within_seconds(handle.result()).await.unwrap(), Ok(Some(7)));
    assert_eq!(env.now(), epoch() + 3 * DAY);
}

/// Timers scheduled and cancelled in the caller's transaction through the
/// runtime's timers are stamped at the virtual time, not the wall clock's.
#[tokio::test]
async fn timers_written_in_a_transaction_are_stamped_at_the_virtual_time() {
    let env = TestEnv::starting_at(epoch()).await;
    let timers = env.keiro().timers();
    let request = TimerRequest::new("t-tx", "test", "t-tx", env.now() + HOUR);
    let mut tx = pool_of(&env).begin_with("BEGIN IMMEDIATE").await.unwrap();
    timers.schedule_tx(&mut tx, &request).await.unwrap();
    assert!(!timers.schedule_once_tx(&mut tx, &request).await.unwrap());
    tx.commit().await.unwrap();
    let id = keiro::timers::TimerId::new("t-tx");
    let row = timers.get(&id).await.unwrap().expect("the timer");
    assert_eq!((row.created_at, row.updated_at), (epoch(), epoch()));

    env.advance(Duration::from_secs(60)).await;
    let mut tx = pool_of(&env).begin_with("BEGIN IMMEDIATE").await.unwrap();
    timers.cancel_tx(&mut tx, &id).await.unwrap();
    tx.commit().await.unwrap();
    let row = timers.get(&id).await.unwrap().expect("the timer");
    assert_eq!(row.updated_at, epoch() + Duration::from_secs(60));
}
