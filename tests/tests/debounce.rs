//! Debounce on both backends: a burst of enqueues with one key starts one
//! instance, after the burst, with the last call's arguments, every call's
//! handle naming it; `max_wait` bounds a burst that never pauses; keys and
//! workflows debounce independently, also with many callers at once; misuse
//! is refused naming the workflow and the option; a debounced call may run
//! on a queue. A `TestEnv` case shows virtual time driving it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro::testing::TestEnv;
use keiro::{step, workflow, Error, Keiro, ListFilter, ResumeOptions, ResumeWorker};
use keiro::{WorkflowHandle, WorkflowStatus};
use keiro_tests::{in_tx, on_both_backends, Backend, TestDb};

keiro::queue!(
    /// No limits: a debounced call on a named queue.
    DEBOUNCED = "debounce-test"
);

/// How long any one test waits for a result.
const PATIENCE: Duration = Duration::from_secs(60);

/// The wall-clock time the step ran (µs since the Unix epoch).
#[step]
async fn started_at() -> Result<i64, String> {
    Ok(now_us())
}

/// The call number it was given and when it started.
#[workflow]
async fn sync_profile(user: String, call: u32) -> Result<(String, u32, i64), String> {
    let at = started_at().await?;
    Ok((user, call, at))
}

/// Another workflow, debounced with the same keys as [`sync_profile`].
#[workflow]
async fn reindex(user: String, call: u32) -> Result<(String, u32), String> {
    Ok((user, call))
}

/// Debounces a call from its own body, which is refused: the error's text.
#[workflow]
async fn debounces_inside() -> Result<String, String> {
    let call = reindex("inside".to_owned(), 1).debounce("k", Duration::from_secs(1));
    match call.enqueue().await {
        Ok(_) => Ok("debounced".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// A resume worker in this process, polling often.
async fn worker_here(keiro: &Keiro) -> ResumeWorker {
    keiro
        .resume_worker(
            ResumeOptions::default()
                .poll_interval(Duration::from_millis(20))
                .concurrency(16),
        )
        .await
        .unwrap()
}

type Synced = Result<(String, u32, i64), String>;

/// Call `n` for `user`, debounced by `user` with `delay`.
fn debounced(keiro: &Keiro, user: &str, n: u32, delay: Duration) -> keiro::WorkflowCall<Synced> {
    sync_profile(user.to_owned(), n)
        .on(keiro)
        .debounce(user, delay)
}

/// Enqueues call `n` for `user`, debounced by `user`.
async fn call(
    keiro: &Keiro,
    user: &str,
    n: u32,
    delay: Duration,
    max_wait: Option<Duration>,
) -> WorkflowHandle<Synced> {
    let mut call = debounced(keiro, user, n, delay);
    if let Some(max) = max_wait {
        call = call.max_wait(max);
    }
    call.enqueue().await.unwrap()
}

async fn result_of(handle: &WorkflowHandle<Synced>) -> (String, u32, i64) {
    tokio::time::timeout(PATIENCE, handle.result())
        .await
        .expect("the debounced instance ends in time")
        .unwrap()
        .unwrap()
}

/// How many instances of `name` exist.
async fn instances(keiro: &Keiro, name: &str) -> usize {
    keiro
        .list(&ListFilter::default().name(name).limit(1000))
        .await
        .unwrap()
        .items
        .len()
}

async fn a_burst_starts_one_instance_with_the_last_arguments(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker_here(&keiro).await;
    let delay = Duration::from_millis(500);
    let mut handles = Vec::new();
    let mut last_call_us = 0;
    // One call every 4 ms: the 50 are made within 200 ms (each waits for
    // its commit, so a slow commit can push the rest later).
    let burst = tokio::time::Instant::now();
    for n in 0..50 {
        tokio::time::sleep_until(burst + Duration::from_millis(4) * n).await;
        last_call_us = now_us();
        handles.push(call(&keiro, "u-1", n, delay, None).await);
    }
    let id = handles[0].id().to_owned();
    assert!(
        handles.iter().all(|h| h.id() == id),
        "every call of the burst names one instance"
    );
    let (user, n, started) = result_of(&handles[17]).await;
    assert_eq!((user.as_str(), n), ("u-1", 49), "the last call's arguments");
    assert!(
        started >= last_call_us + 500_000,
        "started {} µs after the last call, before its delay",
        started - last_call_us
    );
    for handle in &handles {
        assert_eq!(result_of(handle).await.1, 49);
    }
    assert_eq!(
        instances(&keiro, "sync_profile").await,
        1,
        "exactly one run"
    );
    let summary = keiro.summary(&id).await.unwrap();
    assert_eq!(
        summary.debounce_key.as_deref(),
        Some("u-1"),
        "operators see the burst's key"
    );

    // The instance has run: the next call opens a new burst.
    let next = call(&keiro, "u-1", 50, delay, None).await;
    assert_ne!(next.id(), id, "a call after the start makes a new instance");
    assert_eq!(result_of(&next).await.1, 50);
    assert_eq!(instances(&keiro, "sync_profile").await, 2);
    worker.stop().await;
}

async fn max_wait_starts_a_never_ending_burst(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker_here(&keiro).await;
    let (delay, max_wait) = (Duration::from_millis(300), Duration::from_millis(600));
    let first_call_us = now_us();
    let mut handles = Vec::new();
    for n in 0..30 {
        handles.push(call(&keiro, "u-2", n, delay, Some(max_wait)).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last_call_us = now_us();
    let (_, n, started) = result_of(&handles[0]).await;
    let after_first = started - first_call_us;
    assert!(
        after_first >= 600_000,
        "started {after_first} µs after the burst's first call, before max_wait"
    );
    assert!(
        after_first <= 600_000 + 400_000,
        "started {after_first} µs after the burst's first call: max_wait 600 ms not kept"
    );
    assert!(
        started < last_call_us,
        "the first instance started while calls still arrived"
    );
    assert!(n > 0, "calls until the start replaced the arguments");
    let mut ids: Vec<&str> = handles.iter().map(|h| h.id()).collect();
    ids.dedup();
    assert!(
        ids.len() >= 2,
        "calls after the start opened new bursts: {ids:?}"
    );
    let last = result_of(handles.last().unwrap()).await;
    assert_eq!(last.1, 29, "the last burst runs with the last call");
    worker.stop().await;
}

/// A call that joins a burst due later than its own delay (an earlier
/// call's longer delay) keeps its `.timeout` from the burst's start: the
/// instance runs instead of timing out at its claim.
async fn a_later_calls_timeout_moves_with_the_bursts_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker_here(&keiro).await;
    let first_call_us = now_us();
    call(&keiro, "u-timeout", 1, Duration::from_millis(2_000), None).await;
    let last = debounced(&keiro, "u-timeout", 2, Duration::from_millis(300))
        .timeout(Duration::from_millis(1_000))
        .enqueue()
        .await
        .unwrap();
    let (user, n, started) = result_of(&last).await;
    assert_eq!(
        (user.as_str(), n),
        ("u-timeout", 2),
        "the last call's arguments"
    );
    assert!(
        started >= first_call_us + 2_000_000,
        "started {} µs after the first call, before its delay",
        started - first_call_us
    );
    worker.stop().await;
}

/// A call whose absolute deadline falls before the open burst's start (an
/// earlier call's longer delay sets it), or before a new burst's under a
/// `max_wait`, would end the instance unrun: it is refused with
/// `InvalidOption` and changes nothing, so the burst runs with the calls
/// before it.
async fn a_deadline_before_the_bursts_start_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let first = call(&keiro, "u-deadline", 1, Duration::from_millis(1_500), None).await;
    let refused = debounced(&keiro, "u-deadline", 2, Duration::from_millis(100))
        .deadline(SystemTime::now() + Duration::from_millis(700))
        .enqueue()
        .await
        .map(drop)
        .unwrap_err();
    let text = refused.to_string();
    assert!(
        matches!(refused, Error::InvalidOption { .. })
            && text.contains("`sync_profile`")
            && text.contains("not after its burst's instance would start"),
        "{text}"
    );
    let fresh = debounced(&keiro, "u-fresh", 1, Duration::from_millis(500))
        .max_wait(Duration::from_secs(5))
        .deadline(SystemTime::now() + Duration::from_millis(200))
        .enqueue()
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(fresh, Error::InvalidOption { .. }), "{fresh}");
    assert_eq!(
        instances(&keiro, "sync_profile").await,
        1,
        "the refused burst opened"
    );
    let worker = worker_here(&keiro).await;
    let (_, n, _) = result_of(&first).await;
    assert_eq!(n, 1, "the refused call changed the burst");
    worker.stop().await;
}

/// A `max_wait` given by a later call of an open burst bounds it, counted
/// from the burst's first call.
async fn a_later_calls_max_wait_bounds_the_burst(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker_here(&keiro).await;
    let first_call_us = now_us();
    call(&keiro, "u-bound", 1, Duration::from_millis(4_000), None).await;
    let last = call(
        &keiro,
        "u-bound",
        2,
        Duration::from_millis(500),
        Some(Duration::from_millis(1_000)),
    )
    .await;
    let (_, n, started) = result_of(&last).await;
    assert_eq!(n, 2);
    let after_first = started - first_call_us;
    assert!(
        (1_000_000..3_000_000).contains(&after_first),
        "started {after_first} µs after the burst's first call: the later call's max_wait \
         of 1 s not kept"
    );
    worker.stop().await;
}

async fn keys_and_workflows_debounce_independently(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker_here(&keiro).await;
    let delay = Duration::from_millis(400);
    let (mut a, mut b, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..10 {
        a.push(call(&keiro, "a", n, delay, None).await);
        b.push(call(&keiro, "b", 100 + n, delay, None).await);
        let reindexed = reindex("a".to_owned(), 200 + n)
            .on(&keiro)
            .debounce("a", delay)
            .enqueue()
            .await
            .unwrap();
        other.push(reindexed);
    }
    assert!(a.iter().all(|h| h.id() == a[0].id()));
    assert!(b.iter().all(|h| h.id() == b[0].id()));
    assert!(other.iter().all(|h| h.id() == other[0].id()));
    assert_ne!(a[0].id(), b[0].id(), "two keys, two instances");
    assert_ne!(a[0].id(), other[0].id(), "two workflows, two instances");
    assert_eq!(result_of(&a[0]).await.1, 9);
    assert_eq!(result_of(&b[0]).await.1, 109);
    let reindexed = tokio::time::timeout(PATIENCE, other[0].result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reindexed, Ok(("a".to_owned(), 209)));
    worker.stop().await;
}

async fn many_callers_at_once_share_one_burst(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let delay = Duration::from_millis(1500);
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let keiro = keiro.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..10 {
                    let handle = call(&keiro, "shared", task * 10 + n, delay, None).await;
                    ids.push(handle.id().to_owned());
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1, "80 racing calls, one instance: {ids:?}");
    // No worker ran yet: the one instance waits, pending.
    let summary = keiro.summary(&ids[0]).await.unwrap();
    assert_eq!(summary.status, WorkflowStatus::Pending);
    assert_eq!(instances(&keiro, "sync_profile").await, 1);
    let worker = worker_here(&keiro).await;
    let handle = keiro.handle::<Synced>(&ids[0]).await.unwrap();
    result_of(&handle).await;
    worker.stop().await;
}

/// On a server whose default isolation is REPEATABLE READ, keiro's own
/// transactions still run at READ COMMITTED: a call reads the burst as the
/// caller before it committed it, so racing callers share one burst and
/// none fails (at the server's level all but one failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_callers_share_one_burst_under_repeatable_read() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    db.keiro().await; // migrates
    let mut admin = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    sqlx::raw_sql(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation \
           = ''repeatable read''', current_database()); END $$",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    // Connected after the change: every session starts at that isolation.
    let keiro = db.keiro().await;
    let calls = (0..40).map(|n| {
        let keiro = keiro.clone();
        async move {
            debounced(&keiro, "rr", n, Duration::from_secs(30))
                .enqueue()
                .await
                .map(|handle| handle.id().to_owned())
        }
    });
    let mut ids: Vec<String> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|id| id.unwrap_or_else(|e| panic!("a racing call failed: {e}")))
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1, "40 racing calls, one burst: {ids:?}");
    let mut session = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    let isolation: String = sqlx::query_scalar("SHOW default_transaction_isolation")
        .fetch_one(&mut session)
        .await
        .unwrap();
    assert_eq!(isolation, "repeatable read");
}

async fn a_debounced_call_may_run_on_a_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker_here(&keiro).await;
    let mut handles = Vec::new();
    for n in 0..5 {
        let handle = sync_profile("q".to_owned(), n)
            .on(&keiro)
            .queue(&DEBOUNCED)
            .debounce("q", Duration::from_millis(300))
            .enqueue()
            .await
            .unwrap();
        handles.push(handle);
    }
    assert!(handles.iter().all(|h| h.id() == handles[0].id()));
    assert_eq!(result_of(&handles[0]).await.1, 4);
    let summary = keiro.summary(handles[0].id()).await.unwrap();
    assert_eq!(summary.queue.as_deref(), Some("debounce-test"));
    worker.stop().await;
}

async fn misuse_is_refused_naming_the_workflow_and_option(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let said = debounces_inside().on(&keiro).await.unwrap();
    assert!(
        matches!(&said, Err(text) if text.contains("debounced inside a workflow")
            && text.contains("`#[step]` body")),
        "{said:?}"
    );
    let call = || sync_profile("m".to_owned(), 1).on(&keiro);
    let second = Duration::from_secs(1);
    let cases = [
        (
            call().max_wait(second).enqueue().await.map(|_| ()),
            "WorkflowCall::max_wait",
            "without `.debounce",
        ),
        (
            call()
                .debounce("k", Duration::ZERO)
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::debounce",
            "zero",
        ),
        (
            call()
                .debounce("k", second)
                .max_wait(Duration::from_millis(10))
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::max_wait",
            "shorter than its debounce delay",
        ),
        (
            call().debounce("", second).enqueue().await.map(|_| ()),
            "WorkflowCall::debounce",
            "empty debounce key",
        ),
        (
            call()
                .debounce("k", second)
                .id("mine")
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::debounce",
            "`.id(..)`",
        ),
        (
            call()
                .debounce("k", second)
                .delay(second)
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::debounce",
            "`.delay(..)`",
        ),
        (
            call()
                .queue(&DEBOUNCED)
                .dedup("d")
                .debounce("k", second)
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::debounce",
            "`.dedup(..)`",
        ),
        (
            call()
                .debounce("k", second)
                .timeout(second)
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::debounce",
            "`.timeout(1s)`, no longer than its debounce delay",
        ),
        (
            call()
                .debounce("k", second)
                .deadline(SystemTime::now() + Duration::from_millis(500))
                .enqueue()
                .await
                .map(|_| ()),
            "WorkflowCall::debounce",
            "a `.deadline(..)` before its debounce delay ends",
        ),
        (
            call().debounce("k", second).start().await.map(|_| ()),
            "WorkflowCall::debounce",
            "was started",
        ),
        (
            call().debounce("k", second).await.map(|_| ()),
            "WorkflowCall::debounce",
            "was awaited",
        ),
    ];
    for (outcome, want_option, want_reason) in cases {
        match outcome {
            Err(Error::InvalidOption { option, reason }) => {
                assert_eq!(option, want_option, "{reason}");
                assert!(
                    reason.contains("`sync_profile`") && reason.contains(want_reason),
                    "{reason}"
                );
            }
            other => panic!("{want_option} ({want_reason}): expected InvalidOption, got {other:?}"),
        }
    }
    assert_eq!(
        instances(&keiro, "sync_profile").await,
        0,
        "nothing recorded"
    );
}

async fn a_retried_instance_takes_no_more_calls(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let delay = Duration::from_millis(200);
    let first = call(&keiro, "r", 1, delay, None).await;
    keiro.cancel(first.id()).await.unwrap();
    assert_eq!(first.status().await.unwrap(), WorkflowStatus::Cancelled);
    let second = call(&keiro, "r", 2, delay, None).await;
    assert_ne!(
        second.id(),
        first.id(),
        "a cancelled instance ends its burst"
    );

    // Retried, the first is pending and unclaimed again, but it is no burst's:
    // the next call joins the second.
    keiro.retry(first.id()).await.unwrap();
    assert_eq!(first.status().await.unwrap(), WorkflowStatus::Pending);
    let third = call(&keiro, "r", 3, delay, None).await;
    assert_eq!(third.id(), second.id());
    let worker = worker_here(&keiro).await;
    assert_eq!(
        result_of(&first).await.1,
        1,
        "the retried instance kept its call"
    );
    assert_eq!(result_of(&second).await.1, 3);
    assert_eq!(instances(&keiro, "sync_profile").await, 2);
    worker.stop().await;
}

async fn enqueue_tx_debounces_in_the_callers_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let delay = Duration::from_millis(300);
    let debounced = |n: u32| debounced(&keiro, "tx", n, delay);
    let ids = in_tx!(keiro, true, |tx| {
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(
                debounced(n)
                    .enqueue_tx(&mut tx)
                    .await
                    .unwrap()
                    .id()
                    .to_owned(),
            );
        }
        ids
    });
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    // A call rolled back changes nothing.
    let rolled_back = in_tx!(keiro, false, |tx| debounced(99)
        .enqueue_tx(&mut tx)
        .await
        .unwrap()
        .id()
        .to_owned());
    assert_eq!(rolled_back, ids[0]);
    let worker = worker_here(&keiro).await;
    let handle = keiro.handle::<Synced>(&ids[0]).await.unwrap();
    assert_eq!(result_of(&handle).await.1, 2, "the last committed call");
    assert_eq!(instances(&keiro, "sync_profile").await, 1);
    worker.stop().await;
}

/// A call that waits for another's transaction (which holds the burst:
/// PostgreSQL's lock, SQLite's write lock) counts its delay from when it
/// goes on, not from when it was made: the instance is due no sooner than
/// the delay after the call that committed last.
async fn a_call_waiting_for_the_burst_counts_from_when_it_goes_on(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let delay = Duration::from_secs(1);
    let debounced = |n: u32| debounced(&keiro, "waits", n, delay);
    let (id, waiting, committed_at) = in_tx!(keiro, true, |tx| {
        let handle = debounced(0).enqueue_tx(&mut tx).await.unwrap();
        // The next call waits for this transaction meanwhile.
        let next = debounced(1);
        let waiting = tokio::spawn(async move { next.enqueue().await.unwrap() });
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(
            !waiting.is_finished(),
            "the second call waits for the first"
        );
        (handle.id().to_owned(), waiting, now_us())
    });
    assert_eq!(waiting.await.unwrap().id(), id);
    let store = keiro::unstable::raw_store(&keiro);
    let row = store.get_instance(&id).await.unwrap().unwrap();
    let due = row.wake_at.expect("a due time");
    assert!(
        due >= committed_at + delay.as_micros() as i64,
        "due {} µs after the first call's commit",
        due - committed_at
    );
}

/// A call whose process reads an earlier clock (another machine's) takes its
/// arguments into the burst but never brings its start forward.
async fn a_call_on_an_earlier_clock_does_not_bring_the_start_forward(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    let behind = keiro_store::Store::connect(
        &db.url,
        &keiro_store::StoreOptions {
            clock: keiro_store::Clock::manual(SystemTime::now() - Duration::from_secs(10)),
            ..keiro_store::StoreOptions::default()
        },
    )
    .await
    .unwrap();
    let queued = keiro_store::Queued {
        queue: None,
        priority: 0,
        partition: "",
        dedup: None,
        not_before: None,
    };
    let debounce = keiro_store::Debounce {
        key: "skew",
        delay_us: 2_000_000,
        max_wait_us: None,
        deadline_after_start_us: None,
    };
    let first = keiro_store::NewInstance::new("skew-1", "sync_profile", r#"["skew",1]"#);
    let (opened, created) = store
        .create_debounced(&first, &queued, &debounce)
        .await
        .unwrap();
    assert!(created);
    let later = keiro_store::NewInstance::new("skew-2", "sync_profile", r#"["skew",2]"#);
    let (joined, created) = behind
        .create_debounced(&later, &queued, &debounce)
        .await
        .unwrap();
    assert!(!created, "the second call joins the burst");
    assert_eq!(joined.id, "skew-1");
    assert_eq!(joined.input, r#"["skew",2]"#, "the last call's arguments");
    assert_eq!(
        joined.wake_at, opened.wake_at,
        "the start stays where it was"
    );
    behind.close().await;
}

/// A call in a transaction whose snapshot was taken before another opened
/// the burst (PostgreSQL `REPEATABLE READ`; SQLite, a deferred transaction
/// that read first) can neither join the burst it cannot see nor open a
/// second: it is refused naming the workflow and key, having written
/// nothing, and the transaction run again joins the burst.
async fn a_snapshot_older_than_the_burst_is_refused_clearly(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let delay = Duration::from_secs(30);
    let debounced = |n: u32| debounced(&keiro, "snap", n, delay);
    let timers = keiro.timers();
    let (opened, error) = match keiro_tests::timers::pool(&timers) {
        keiro_tests::timers::Pool::Sqlite(pool) => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT count(*) FROM keiro_workflows")
                .execute(&mut *tx)
                .await
                .unwrap();
            let opened = debounced(0).enqueue().await.unwrap();
            let error = debounced(1).enqueue_tx(&mut tx).await.unwrap_err();
            tx.rollback().await.unwrap();
            (opened, error)
        }
        keiro_tests::timers::Pool::Postgres(pool) => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query("SELECT count(*) FROM keiro.workflows")
                .execute(&mut *tx)
                .await
                .unwrap();
            let opened = debounced(0).enqueue().await.unwrap();
            let error = debounced(1).enqueue_tx(&mut tx).await.unwrap_err();
            tx.rollback().await.unwrap();
            (opened, error)
        }
    };
    assert!(
        matches!(
            &error,
            Error::Store(keiro::StoreError::BurstConflict { name, key, .. })
                if name == "sync_profile" && key == "snap"
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("run it again"), "{message}");
    assert_eq!(
        instances(&keiro, "sync_profile").await,
        1,
        "nothing written"
    );
    let joined = in_tx!(keiro, true, |tx| debounced(2)
        .enqueue_tx(&mut tx)
        .await
        .unwrap()
        .id()
        .to_owned());
    assert_eq!(joined, opened.id(), "run again, the call joins the burst");
    let store = keiro::unstable::raw_store(&keiro);
    let row = store.get_instance(&joined).await.unwrap().unwrap();
    assert_eq!(row.input, r#"["snap",2]"#);
}

on_both_backends!(
    a_later_calls_timeout_moves_with_the_bursts_start,
    a_deadline_before_the_bursts_start_is_refused,
    a_later_calls_max_wait_bounds_the_burst,
    a_snapshot_older_than_the_burst_is_refused_clearly,
    a_retried_instance_takes_no_more_calls,
    a_call_waiting_for_the_burst_counts_from_when_it_goes_on,
    a_call_on_an_earlier_clock_does_not_bring_the_start_forward,
    enqueue_tx_debounces_in_the_callers_transaction,
    a_burst_starts_one_instance_with_the_last_arguments,
    max_wait_starts_a_never_ending_burst,
    keys_and_workflows_debounce_independently,
    many_callers_at_once_share_one_burst,
    a_debounced_call_may_run_on_a_queue,
    misuse_is_refused_naming_the_workflow_and_option,
);

#[tokio::test]
async fn virtual_time_ends_a_burst_and_keeps_max_wait() {
    let env = TestEnv::new().await;
    let keiro = env.keiro();
    let (delay, max_wait) = (Duration::from_secs(60), Duration::from_secs(150));
    let first = call(keiro, "v", 0, delay, Some(max_wait)).await;
    for n in 1..=2 {
        env.advance(Duration::from_secs(50)).await;
        let next = call(keiro, "v", n, delay, Some(max_wait)).await;
        assert_eq!(next.id(), first.id());
        assert_eq!(first.status().await.unwrap(), WorkflowStatus::Pending);
    }
    // 100 s in, the last call said 160 s; max_wait says 150 s.
    env.advance(Duration::from_secs(49)).await;
    assert_eq!(first.status().await.unwrap(), WorkflowStatus::Pending);
    env.advance(Duration::from_secs(1)).await;
    assert_eq!(first.status().await.unwrap(), WorkflowStatus::Completed);
    assert_eq!(result_of(&first).await.1, 2);

    // A quiet burst ends `delay` after its last call.
    let quiet = call(keiro, "v", 10, delay, None).await;
    assert_ne!(quiet.id(), first.id());
    env.advance(Duration::from_secs(59)).await;
    assert_eq!(quiet.status().await.unwrap(), WorkflowStatus::Pending);
    env.advance(Duration::from_secs(1)).await;
    assert_eq!(result_of(&quiet).await.1, 10);
}
