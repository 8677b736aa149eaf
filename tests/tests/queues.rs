//! Queues on both backends: `concurrency` across worker processes,
//! `worker_concurrency` per process, a sliding-window rate limit, priority
//! order, partitions, dedup and delay. The jobs record their step's start and
//! end in a file (see `keiro_tests::queues`), from which each test replays
//! how many ran at once.

use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keiro::{Error, Keiro, ResumeOptions, ResumeWorker, WorkflowHandle};
use keiro_tests::process::CrashChild;
use keiro_tests::queues::{
    events, gated_job, held_job, max_in_flight, queue_job, sleeping_job, spawns_on_a_queue,
    CONCURRENCY_2, ONE_AT_A_TIME, PER_WORKER_1, PLAIN, RATE_20,
};
use keiro_tests::{on_both_backends, Backend, TestDb};

const WORKER: &str = env!("CARGO_BIN_EXE_queue_worker");

/// How long any one test waits for its jobs.
const PATIENCE: Duration = Duration::from_secs(90);

/// `count` worker processes on `db`, each serving once its log says so and
/// running up to `concurrency` instances at once.
async fn worker_processes(db: &TestDb, count: usize, concurrency: usize) -> Vec<CrashChild> {
    let mut workers = Vec::new();
    let concurrency = concurrency.to_string();
    for n in 0..count {
        let id = format!("queue-worker-{n}-{}", uuid::Uuid::new_v4().simple());
        let mut child = CrashChild::start(WORKER, db, &id, &[&concurrency], None);
        child.line_containing("serves").await;
        workers.push(child);
    }
    workers
}

/// A resume worker in this process, polling often, running up to 32 at once.
async fn worker_here(keiro: &Keiro) -> ResumeWorker {
    worker_of(keiro, 32).await
}

/// A runtime on `db` whose runs renew their leases every second (a 3 s
/// TTL), so they learn of a cancel within one.
async fn renewing_every_second(db: &TestDb) -> Keiro {
    db.builder()
        .lease_ttl(Duration::from_secs(3))
        .connect()
        .await
        .unwrap()
}

/// A resume worker of `keiro`, polling often, running up to `concurrency`
/// at once.
async fn worker_of(keiro: &Keiro, concurrency: usize) -> ResumeWorker {
    keiro
        .resume_worker(
            ResumeOptions::default()
                .poll_interval(Duration::from_millis(20))
                .concurrency(concurrency),
        )
        .await
        .unwrap()
}

/// Waits until a job tagged `tag` has recorded an event in `file`.
async fn until_tagged(file: &Path, tag: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !events(file).iter().any(|e| e.tag == tag) {
        assert!(Instant::now() < deadline, "job {tag} never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// When job `tag` first recorded `what` (µs since the Unix epoch).
fn first_at(events: &[keiro_tests::queues::Event], what: &str, tag: &str) -> i64 {
    events
        .iter()
        .find(|e| e.what == what && e.tag == tag)
        .unwrap_or_else(|| panic!("no {what} of {tag}: {events:?}"))
        .at_us
}

/// Waits for every handle's result, which must be its tag.
async fn all_done(handles: Vec<WorkflowHandle<Result<String, String>>>) {
    let results = tokio::time::timeout(
        PATIENCE,
        futures::future::join_all(handles.iter().map(|h| h.result())),
    )
    .await
    .expect("every job ends in time");
    for (handle, result) in handles.iter().zip(results) {
        let tag = result.unwrap().unwrap();
        assert!(
            handle.id().ends_with(&tag),
            "{} returned {tag}",
            handle.id()
        );
    }
}

fn events_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events");
    (dir, file)
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

async fn concurrency_holds_across_worker_processes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // Each process runs one at a time, so reaching 2 takes two processes at
    // once, and only the queue's limit keeps the three from running 3.
    let workers = worker_processes(&db, 3, 1).await;
    let (_dir, file) = events_file();
    let mut handles = Vec::new();
    for n in 0..60 {
        let call = queue_job(text(&file), format!("{n}"), 40);
        let id = format!("conc-{n}");
        handles.push(
            call.on(&keiro)
                .id(id)
                .queue(&CONCURRENCY_2)
                .enqueue()
                .await
                .unwrap(),
        );
    }
    all_done(handles).await;
    let events = events(&file);
    assert_eq!(events.len(), 120, "every job started and ended once");
    let (max, per_process) = max_in_flight(&events);
    assert_eq!(max, 2, "at most 2 at once across processes, and 2 reached");
    assert!(
        per_process.len() >= 2,
        "the jobs ran in several processes: {per_process:?}"
    );
    for worker in workers {
        worker.kill().await;
    }
}

async fn worker_concurrency_holds_per_process(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let workers = worker_processes(&db, 3, 32).await;
    let (_dir, file) = events_file();
    let mut handles = Vec::new();
    for n in 0..30 {
        let call = queue_job(text(&file), format!("{n}"), 60);
        let id = format!("per-worker-{n}");
        handles.push(
            call.on(&keiro)
                .id(id)
                .queue(&PER_WORKER_1)
                .enqueue()
                .await
                .unwrap(),
        );
    }
    all_done(handles).await;
    let events = events(&file);
    assert_eq!(events.len(), 60);
    let (max, per_process) = max_in_flight(&events);
    for (pid, most) in &per_process {
        assert_eq!(
            *most, 1,
            "process {pid} ran {most} at once: {per_process:?}"
        );
    }
    assert!(max >= 2, "the processes ran side by side (max {max})");
    for worker in workers {
        worker.kill().await;
    }
}

/// Reads when each instance of `queue` first started, as the store recorded
/// it at the claim (what the rate limit counts), in time order.
async fn recorded_starts(db: &TestDb, backend: Backend, queue: &str) -> Vec<i64> {
    let mut starts: Vec<i64> = match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query_scalar(
                "SELECT queue_started_at FROM keiro_workflows WHERE queue = $1 \
                 AND queue_started_at IS NOT NULL",
            )
            .bind(queue)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
        Backend::Postgres | Backend::PgBouncer => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            sqlx::query_scalar(
                "SELECT queue_started_at FROM keiro.workflows WHERE queue = $1 \
                 AND queue_started_at IS NOT NULL",
            )
            .bind(queue)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    starts.sort_unstable();
    starts
}

/// Enqueues `count` `queue_job`s holding `hold_ms` on `RATE_20`, with ids
/// `{prefix}-{n}` and tags `n`, recording to `file`.
async fn enqueue_rated(
    keiro: &Keiro,
    file: &Path,
    prefix: &str,
    count: u32,
    hold_ms: u64,
) -> Vec<WorkflowHandle<Result<String, String>>> {
    let mut handles = Vec::new();
    for n in 0..count {
        let call = queue_job(text(file), format!("{n}"), hold_ms);
        let id = format!("{prefix}-{n}");
        handles.push(
            call.on(keiro)
                .id(id)
                .queue(&RATE_20)
                .enqueue()
                .await
                .unwrap(),
        );
    }
    handles
}

async fn rate_limit_spaces_starts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let handles = enqueue_rated(&keiro, &file, "rate", 100, 500).await;
    let began = Instant::now();
    let worker = worker_here(&keiro).await;
    all_done(handles).await;
    // 100 starts at 20 within any second: the 81st starts at least 4 s after
    // the first, and holds 0.5 s.
    let took = began.elapsed();
    assert!(took >= Duration::from_millis(4_500), "took {took:?}");
    let starts = recorded_starts(&db, backend, "test-rate-20").await;
    assert_eq!(starts.len(), 100);
    for (first, twenty_first) in starts.iter().zip(starts.iter().skip(20)) {
        assert!(
            twenty_first - first >= 1_000_000,
            "21 starts within one second: {first} .. {twenty_first}"
        );
    }
    assert_eq!(events(&file).len(), 200);
    worker.stop().await;
}

keiro::queue!(
    /// One start in any 30 s (declared here only: a window this long would
    /// hold back the retention other test binaries use).
    ONE_IN_30S = "test-one-in-30s",
    rate_limit = (1, Duration::from_secs(30))
);

/// A rate limit holds back first starts only: an instance that suspended
/// in a durable sleep resumes when due though its own start fills the
/// window, while a second instance waits for the window to pass.
async fn a_rate_limit_holds_back_new_starts_not_resumes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let slept = sleeping_job(text(&file), "slept".into(), 2_000)
        .on(&keiro)
        .id("slept")
        .queue(&ONE_IN_30S)
        .enqueue()
        .await
        .unwrap();
    let worker = worker_here(&keiro).await;
    let deadline = Instant::now() + PATIENCE;
    while !events(&file).iter().any(|e| e.what == "first") {
        assert!(
            Instant::now() < deadline,
            "the first instance never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waits = queue_job(text(&file), "waits".into(), 1)
        .on(&keiro)
        .id("waits")
        .queue(&ONE_IN_30S)
        .enqueue()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(15), slept.result())
        .await
        .expect("the slept instance resumes though the window is full")
        .unwrap();
    assert_eq!(out, Ok("slept".to_owned()));
    let tags: Vec<String> = events(&file).into_iter().map(|e| e.tag).collect();
    assert!(!tags.iter().any(|t| t == "waits"), "{tags:?}");
    assert_eq!(
        recorded_starts(&db, backend, "test-one-in-30s").await.len(),
        1
    );
    assert_eq!(
        waits.status().await.unwrap(),
        keiro::WorkflowStatus::Pending
    );
    worker.stop().await;
}

/// PostgreSQL: two transactions enqueue one dedup key under two ids. The
/// one left waiting on the other's commit is refused with `Error::Duplicate`
/// naming the winner (not a raw unique-index error), and its transaction
/// stays usable, holding nothing of the refused call. Likewise a resume of
/// an instance set aside, and a retry of a cancelled one, that wait on an
/// enqueue of their key. Also through pgbouncer (transaction mode), where a
/// savepoint must leave nothing prepared on the server.
async fn a_dedup_race_between_transactions_is_refused_as_a_duplicate(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let keiro_store::Store::Postgres(store) = keiro::unstable::raw_store(&keiro) else {
        unreachable!("a PostgreSQL test database")
    };
    let pool = store.pool().clone();
    // Watches the server past any proxy.
    let direct = sqlx::PgPool::connect(&db.direct_url).await.unwrap();
    let mut first = pool.begin().await.unwrap();
    dedup_job(&keiro, &file, "race-1", "one-key")
        .enqueue_tx(&mut first)
        .await
        .unwrap();
    let (keiro2, file2, pool2) = (keiro.clone(), file.clone(), pool.clone());
    let second = tokio::spawn(async move {
        let mut tx = pool2.begin().await.unwrap();
        let refused = dedup_job(&keiro2, &file2, "race-2", "one-key")
            .enqueue_tx(&mut tx)
            .await
            .map(drop);
        // Unnamed: through pgbouncer a named statement would stay on the
        // server connection for another client to meet.
        let usable: i32 = sqlx::query_scalar("SELECT 1")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        (refused, usable)
    });
    // The second enqueue waits on the first's key.
    wait_for_a_lock_wait(&direct).await;
    first.commit().await.unwrap();
    let (refused, usable) = second.await.unwrap();
    let error = refused.unwrap_err();
    assert!(
        matches!(&error, Error::Duplicate { existing_id, key, .. }
            if existing_id == "race-1" && key == "one-key"),
        "{error:?}"
    );
    assert_eq!(usable, 1);
    assert!(
        keiro.summary("race-2").await.is_err(),
        "the refused call left an instance"
    );
    assert_eq!(
        keiro.summary("race-1").await.unwrap().status,
        keiro::WorkflowStatus::Pending
    );

    // The same race against `resume` of an instance set aside (which frees
    // its key): the enqueue that commits the key first wins, and the resume
    // is refused as its duplicate.
    dedup_job(&keiro, &file, "aside", "two-key")
        .enqueue()
        .await
        .unwrap();
    set_aside(&db, backend, "aside").await;
    let keiro2 = keiro.clone();
    let taker = dedup_job(&keiro, &file, "taker", "two-key");
    let error = taken_meanwhile(&pool, &direct, taker, async move {
        keiro2.resume("aside").await
    })
    .await;
    assert!(
        matches!(&error, Error::Duplicate { existing_id, .. } if existing_id == "taker"),
        "{error:?}"
    );
    let status = keiro.summary("aside").await.unwrap().status;
    assert!(
        matches!(status, keiro::WorkflowStatus::NonDeterministic { .. }),
        "{status:?}"
    );

    // And against `retry` of a cancelled instance (whose end freed its key).
    dedup_job(&keiro, &file, "ended", "three-key")
        .enqueue()
        .await
        .unwrap();
    keiro.cancel("ended").await.unwrap();
    let keiro2 = keiro.clone();
    let taker = dedup_job(&keiro, &file, "taker-3", "three-key");
    let error = taken_meanwhile(&pool, &direct, taker, async move {
        keiro2.retry("ended").await.map(drop)
    })
    .await;
    assert!(
        matches!(&error, Error::Duplicate { existing_id, .. } if existing_id == "taker-3"),
        "{error:?}"
    );
    assert_eq!(
        keiro.summary("ended").await.unwrap().status,
        keiro::WorkflowStatus::Cancelled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dedup_race_between_transactions_is_refused_as_a_duplicate() {
    a_dedup_race_between_transactions_is_refused_as_a_duplicate(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_a_dedup_race_between_transactions_is_refused_as_a_duplicate() {
    a_dedup_race_between_transactions_is_refused_as_a_duplicate(Backend::PgBouncer).await;
}

/// PostgreSQL: a pass whose claim of one queue fails (here a named queue's
/// lock wait runs past the database's `lock_timeout`) still drives what
/// its other claims took, the default queue's instance, and reports the
/// failure; before, the whole pass failed and rows claimed before the
/// failing source waited out their lease undriven.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_failing_queue_claim_costs_the_other_sources_nothing() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET lock_timeout = %L', \
         current_database(), '300ms'); END $$",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let plain = queue_job(text(&file), "plain".into(), 1)
        .on(&keiro)
        .id("on-default")
        .enqueue()
        .await
        .unwrap();
    let queued = queue_job(text(&file), "queued".into(), 1)
        .on(&keiro)
        .id("on-plain")
        .queue(&PLAIN)
        .enqueue()
        .await
        .unwrap();
    // Another session holds the named queue's claim lock.
    sqlx::query("SELECT pg_advisory_lock(1801808241, hashtext('test-plain'))")
        .execute(&mut admin)
        .await
        .unwrap();
    let failures = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = failures.clone();
    let options = ResumeOptions::default().log(move |event| {
        if let keiro::ResumeEvent::PassFailed { error } = event {
            seen.lock().unwrap().push(error.to_string());
        }
    });
    // However the turns order the two sources, the default queue's
    // instance runs in this pass.
    keiro.resume_once(&options).await.unwrap();
    assert_eq!(plain.result().await.unwrap().unwrap(), "plain");
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.iter().any(|f| f.contains("lock")),
        "the failed claim is reported: {failures:?}"
    );
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut admin)
        .await
        .unwrap();
    keiro.resume_once(&options).await.unwrap();
    assert_eq!(queued.result().await.unwrap().unwrap(), "queued");
}

/// PostgreSQL: a rate limit counts one window across workers whose clocks
/// differ (within the skew limit). A worker process whose clock runs a
/// second behind starts the first 20 of a queue of 20 a second; a worker
/// here, on the true clock, starts the rest. By the workers' own clocks the
/// first 20 fell out of the window as soon as they started (stamped a
/// second early); by the server's, which the claims count and stamp by,
/// the 21st starts a second after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_rate_limit_holds_across_workers_whose_clocks_differ() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let (dir, file) = events_file();
    let handles = enqueue_rated(&keiro, &file, "skewed-rate", 40, 50).await;
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "-1s").unwrap();
    let env = keiro_tests::faketime::shifted_env(&offset);
    let mut behind = CrashChild::start_with_env(WORKER, &db, &env, &["32"]);
    behind.line_containing("serves").await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let started = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM keiro.workflows WHERE queue = 'test-rate-20' \
             AND queue_started_at IS NOT NULL",
        )
    };
    // The first start, as seen here; then this worker joins in.
    let deadline = Instant::now() + PATIENCE;
    while started().fetch_one(&mut conn).await.unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "the worker behind started nothing"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first_seen = Instant::now();
    let here = worker_here(&keiro).await;
    while started().fetch_one(&mut conn).await.unwrap() <= 20 {
        assert!(Instant::now() < deadline, "the 21st start never came");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let gap = first_seen.elapsed();
    all_done(handles).await;
    here.stop().await;
    behind.kill().await;
    // The 21st starts a second after the first; seen here up to a poll
    // and the first claim's commit after the first, so less than a second
    // (the code before started it 44 ms after).
    assert!(
        gap >= Duration::from_millis(600),
        "21 starts within {gap:?} on a queue of 20 a second"
    );
}

/// Runs `call` while a transaction on `pool` holds `taker`'s dedup key
/// (enqueued, not yet committed); once `call` waits on it (seen on
/// `direct`), commits the transaction. Returns `call`'s error.
async fn taken_meanwhile(
    pool: &sqlx::PgPool,
    direct: &sqlx::PgPool,
    taker: keiro::WorkflowCall<Result<String, String>>,
    call: impl std::future::Future<Output = keiro::Result<()>> + Send + 'static,
) -> Error {
    let mut tx = pool.begin().await.unwrap();
    taker.enqueue_tx(&mut tx).await.unwrap();
    let call = tokio::spawn(call);
    wait_for_a_lock_wait(direct).await;
    tx.commit().await.unwrap();
    call.await.unwrap().unwrap_err()
}

/// Waits until a session of this database waits on a lock.
async fn wait_for_a_lock_wait(pool: &sqlx::PgPool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no session waited on a lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn lower_priority_runs_first_fifo_among_equals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let priorities = [5, 1, 3, 1, 0, 5, 2, 0, 3, 1];
    let mut handles = Vec::new();
    for (n, priority) in priorities.iter().enumerate() {
        let call = queue_job(text(&file), format!("{n}"), 5);
        let call = call.on(&keiro).id(format!("prio-{n}")).queue(&PER_WORKER_1);
        handles.push(call.priority(*priority).enqueue().await.unwrap());
    }
    let worker = worker_here(&keiro).await;
    all_done(handles).await;
    let started: Vec<usize> = events(&file)
        .iter()
        .filter(|e| e.what == "start")
        .map(|e| e.tag.parse().unwrap())
        .collect();
    let mut expected: Vec<usize> = (0..priorities.len()).collect();
    expected.sort_by_key(|&n| (priorities[n], n));
    assert_eq!(started, expected);
    worker.stop().await;
}

/// Enqueues made at once (their records share a commit) run in the order
/// they were made, not in the order of their ids.
async fn enqueues_made_at_once_run_in_the_order_made(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    // Ids falling in order as they are made; every other one with a dedup
    // key (recorded by a path of its own).
    let tags: Vec<String> = (0..24).map(|n| format!("{}", 99 - n)).collect();
    let calls = tags.iter().enumerate().map(|(n, tag)| {
        let call = queue_job(text(&file), tag.clone(), 1).on(&keiro);
        let call = call.id(format!("at-once-{tag}")).queue(&PER_WORKER_1);
        match n % 2 {
            0 => call.dedup(format!("key-{tag}")).enqueue(),
            _ => call.enqueue(),
        }
    });
    let handles: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let worker = worker_here(&keiro).await;
    all_done(handles).await;
    worker.stop().await;
    let started: Vec<String> = events(&file)
        .into_iter()
        .filter(|e| e.what == "start")
        .map(|e| e.tag)
        .collect();
    assert_eq!(started, tags);
}

/// An instance stopped between its steps is later handed a slot by the end
/// of the instance before it (not claimed): it resumes from its journal,
/// never running its journaled step again.
async fn a_handed_over_instance_resumes_from_its_journal(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (dir, file) = events_file();
    let gate = text(&dir.path().join("gate"));
    // A gated job tagged and identified `tag` on the one-slot queue.
    let enqueue = |tag: &'static str, priority: i64| {
        gated_job(text(&file), tag.into(), gate.clone())
            .on(&keiro)
            .id(tag)
            .queue(&ONE_AT_A_TIME)
            .priority(priority)
            .enqueue()
    };
    let gated = enqueue("gated", 5).await.unwrap();
    let worker = worker_here(&keiro).await;
    // Its second step runs: the first is journaled. Stopping the worker
    // releases it there, its journal kept.
    let deadline = Instant::now() + PATIENCE;
    while !events(&file).iter().any(|e| e.what == "start") {
        assert!(
            Instant::now() < deadline,
            "the gated job's second step never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
    // Ahead of it in the queue's order now: a job of the same workflow
    // (its gate open) whose end hands the one slot over to it.
    std::fs::write(&gate, "open").unwrap();
    let ahead = enqueue("ahead", 0).await.unwrap();
    let worker = worker_here(&keiro).await;
    assert_eq!(ahead.result().await.unwrap().unwrap(), "ahead");
    let result = tokio::time::timeout(PATIENCE, gated.result())
        .await
        .expect("the gated job ends in time");
    assert_eq!(result.unwrap().unwrap(), "gated");
    let ran: Vec<String> = events(&file)
        .iter()
        .map(|e| format!("{} {}", e.what, e.tag))
        .collect();
    assert_eq!(
        ran,
        [
            "first gated",
            "start gated",
            "first ahead",
            "start ahead",
            "start gated"
        ],
        "the first step ran once; the slot went from `ahead` to `gated`"
    );
    worker.stop().await;
}

async fn a_busy_partition_does_not_block_another(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (first, second) = (db.keiro().await, db.keiro().await);
    let (_dir, file) = events_file();
    let workers = [worker_here(&first).await, worker_here(&second).await];
    let enqueue = |tag: &str, partition: &str, hold_ms: u64| {
        queue_job(text(&file), tag.to_owned(), hold_ms)
            .on(&first)
            .id(format!("part-{tag}"))
            .queue(&ONE_AT_A_TIME)
            .partition(partition)
            .enqueue()
    };
    let busy = enqueue("busy", "a", 2_000).await.unwrap();
    until_tagged(&file, "busy").await;
    let same = enqueue("same", "a", 10).await.unwrap();
    let other = enqueue("other", "b", 10).await.unwrap();
    all_done(vec![busy, same, other]).await;
    let events = events(&file);
    let at = |what: &str, tag: &str| {
        events
            .iter()
            .find(|e| e.what == what && e.tag == tag)
            .unwrap()
            .at_us
    };
    assert!(
        at("end", "other") < at("end", "busy"),
        "partition b ran while partition a was busy"
    );
    assert!(
        at("start", "same") >= at("end", "busy"),
        "partition a ran one at a time"
    );
    for worker in workers {
        worker.stop().await;
    }
}

/// A 10 ms `queue_job` with id `id` on `PLAIN` with dedup `key`.
fn dedup_job(
    keiro: &Keiro,
    file: &Path,
    id: &str,
    key: &str,
) -> keiro::WorkflowCall<Result<String, String>> {
    queue_job(text(file), id.to_owned(), 10)
        .on(keiro)
        .id(id.to_owned())
        .queue(&PLAIN)
        .dedup(key.to_owned())
}

async fn dedup_refuses_while_unfinished_and_accepts_after(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let job = |id: &str| dedup_job(&keiro, &file, id, "order-7");
    let first = job("dedup-1").enqueue().await.unwrap();
    let summary = keiro.summary("dedup-1").await.unwrap();
    assert_eq!(summary.queue.as_deref(), Some("test-plain"));
    match job("dedup-2").enqueue().await {
        Err(Error::Duplicate {
            queue,
            key,
            existing_id,
        }) => {
            assert_eq!(
                (queue.as_str(), key.as_str(), existing_id.as_str()),
                ("test-plain", "order-7", "dedup-1")
            );
        }
        other => panic!("expected Error::Duplicate, got {other:?}"),
    }
    // The same call again attaches to the instance holding the key.
    job("dedup-1").enqueue().await.unwrap();
    let worker = worker_here(&keiro).await;
    all_done(vec![first]).await;
    let again = job("dedup-2").enqueue().await.unwrap();
    all_done(vec![again]).await;
    worker.stop().await;
}

/// Sets instance `id` aside as non-deterministic, as a replay that met
/// changed code would.
async fn set_aside(db: &TestDb, backend: Backend, id: &str) {
    let sql = "UPDATE {t} SET status = 'nondeterministic', error = 'changed code' WHERE id = $1";
    match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query(&sql.replace("{t}", "keiro_workflows"))
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
        }
        Backend::Postgres | Backend::PgBouncer => {
            let pool = sqlx::PgPool::connect(&db.direct_url).await.unwrap();
            sqlx::query(&sql.replace("{t}", "keiro.workflows"))
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
        }
    }
}

async fn a_dedup_key_taken_meanwhile_refuses_retry_and_resume_but_not_an_attach(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let job = |id: &str| dedup_job(&keiro, &file, id, "order-9");
    // `a` holds the key, is cancelled (which frees it), and `b` takes it.
    job("a").enqueue().await.unwrap();
    keiro.cancel("a").await.unwrap();
    job("b").enqueue().await.unwrap();
    let is_b = |result: keiro::Result<()>| {
        matches!(&result, Err(Error::Duplicate { queue, key, existing_id })
            if queue == "test-plain" && key == "order-9" && existing_id == "b")
        .then_some(())
        .ok_or(result)
    };
    is_b(keiro.retry("a").await).expect("retry of `a` refused as a duplicate of `b`");
    assert_eq!(
        keiro.summary("a").await.unwrap().status,
        keiro::WorkflowStatus::Cancelled
    );
    set_aside(&db, backend, "a").await;
    is_b(keiro.resume("a").await).expect("resume of `a` refused as a duplicate of `b`");
    // The call that made `a` again attaches to `a` (its id exists), whoever
    // holds the key now.
    let again = job("a").enqueue().await.unwrap();
    assert_eq!(again.id(), "a");
}

async fn delay_is_respected_on_a_queue_and_the_default_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let worker = worker_here(&keiro).await;
    let enqueued_at = now_us();
    let delay = Duration::from_millis(800);
    let queued = queue_job(text(&file), "queued".into(), 1)
        .on(&keiro)
        .id("delay-queued")
        .queue(&PLAIN)
        .delay(delay)
        .enqueue()
        .await
        .unwrap();
    let default = queue_job(text(&file), "default".into(), 1)
        .on(&keiro)
        .id("delay-default")
        .delay(delay)
        .enqueue()
        .await
        .unwrap();
    all_done(vec![queued, default]).await;
    assert_eq!(keiro.summary("delay-default").await.unwrap().queue, None);
    for event in events(&file).iter().filter(|e| e.what == "start") {
        assert!(
            event.at_us >= enqueued_at + 800_000,
            "{} started {} µs after its enqueue",
            event.tag,
            event.at_us - enqueued_at
        );
    }
    worker.stop().await;
}

/// A worker refills a queue's free slots while its other instances run: on a
/// pool of two connections, with 32 instances at once all busy with the
/// database, the refill claims must not wait for a connection that only the
/// instances they stopped driving could give back.
async fn refills_do_not_starve_a_small_pool(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.builder().max_connections(2).connect().await.unwrap();
    let (_dir, file) = events_file();
    let mut handles = Vec::new();
    for n in 0..200 {
        let call = queue_job(text(&file), format!("{n}"), 0).on(&keiro);
        let call = call.id(format!("small-pool-{n}")).queue(&PLAIN);
        handles.push(call.enqueue().await.unwrap());
    }
    let worker = worker_here(&keiro).await;
    all_done(handles).await;
    worker.stop().await;
}

/// A queue whose backlog fills every slot of a worker does not keep them:
/// each pass of the worker hands over and refills a bounded number, then
/// gives its slots back, so an instance due on the default queue meanwhile
/// starts long before the backlog is done.
async fn a_busy_queue_leaves_room_for_the_default_queue(backend: Backend) {
    one_beside_a_backlog(backend, Some(&PLAIN), None).await;
}

/// The same across two named queues: `test-plain` is claimed before
/// `test-rate-20` (in name order) when neither has had its turn.
async fn a_busy_queue_leaves_room_for_another_queue(backend: Backend) {
    one_beside_a_backlog(backend, Some(&PLAIN), Some(&RATE_20)).await;
}

/// And a backlog on the default queue beside a named queue.
async fn a_busy_default_queue_leaves_room_for_a_queue(backend: Backend) {
    one_beside_a_backlog(backend, None, Some(&PLAIN)).await;
}

/// With 40 instances of 50 ms waiting on `backlog_on` (`None`: the default
/// queue) for a worker running two at once, one enqueued on `one_on` later
/// runs long before the backlog is done.
async fn one_beside_a_backlog(
    backend: Backend,
    backlog_on: Option<&'static keiro::Queue>,
    one_on: Option<&'static keiro::Queue>,
) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let mut queued = Vec::new();
    for n in 0..40 {
        let call = queue_job(text(&file), format!("{n}"), 50).on(&keiro);
        let call = call.id(format!("backlog-{n}"));
        let call = match backlog_on {
            Some(queue) => call.queue(queue),
            None => call,
        };
        queued.push(call.enqueue().await.unwrap());
    }
    let worker = worker_of(&keiro, 2).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let call = queue_job(text(&file), "beside".into(), 0)
        .on(&keiro)
        .id("beside-the-backlog");
    let call = match one_on {
        Some(queue) => call.queue(queue),
        None => call,
    };
    let beside = call.enqueue().await.unwrap();
    let out = tokio::time::timeout(PATIENCE, beside.result())
        .await
        .unwrap();
    assert_eq!(out.unwrap(), Ok("beside".to_string()));
    let mut unfinished = 0;
    for handle in &queued {
        if handle.status().await.unwrap() != keiro::WorkflowStatus::Completed {
            unfinished += 1;
        }
    }
    // The backlog takes about a second (40 × 50 ms, two at a time).
    assert!(
        unfinished >= 20,
        "the instance waited for the backlog: {unfinished} of 40 unfinished"
    );
    all_done(queued).await;
    worker.stop().await;
}

async fn queue_settings_need_an_enqueue_and_a_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let call = || queue_job("unused".into(), "x".into(), 1).on(&keiro);
    let started = call().queue(&PLAIN).start().await;
    assert!(
        matches!(&started, Err(Error::InvalidOption { reason, .. }) if reason.contains("queue_job") && reason.contains("enqueue")),
        "{started:?}"
    );
    let no_queue = call().priority(1).enqueue().await;
    assert!(
        matches!(&no_queue, Err(Error::InvalidOption { reason, .. }) if reason.contains(".priority(..)")),
        "{no_queue:?}"
    );
}

async fn a_spawned_child_with_queue_settings_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // A spawned child runs at once: its queue's limit would not hold.
    let said = spawns_on_a_queue().on(&keiro).await.unwrap();
    assert!(
        matches!(&said, Err(text) if text.contains("queue_job") && text.contains("keiro::spawn") && text.contains("enqueue")),
        "{said:?}"
    );
}

async fn an_instance_waiting_past_its_lease_is_not_run_twice(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_dir, file) = events_file();
    // Leases of 600 ms: a claimed instance waiting behind a 2.5 s run lapses.
    let lease = Duration::from_millis(600);
    let keiro = db.builder().lease_ttl(lease).connect().await.unwrap();
    // On the default queue, which a pass claims ahead of its free slots (a
    // named queue's instances it claims only into them).
    let handles = futures::future::try_join_all((0..2).map(|n| {
        queue_job(text(&file), format!("t{n}"), 2500)
            .on(&keiro)
            .id(format!("lapse-t{n}"))
            .enqueue()
    }))
    .await
    .unwrap();
    // One at a time: its pass claims both, runs one, keeps one waiting.
    let options = ResumeOptions::default()
        .poll_interval(Duration::from_millis(20))
        .concurrency(1);
    let first = keiro.resume_worker(options.clone()).await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    while events(&file).is_empty() {
        assert!(Instant::now() < deadline, "no job started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A second worker finds the waiting one's lease lapsed and runs it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let other = db.builder().lease_ttl(lease).connect().await.unwrap();
    let second = other.resume_worker(options).await.unwrap();
    all_done(handles).await;
    // The first worker reaches its stale copy once its run ends.
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.stop().await;
    second.stop().await;
    let events = events(&file);
    for tag in ["t0", "t1"] {
        let starts = events
            .iter()
            .filter(|e| e.what == "start" && e.tag == tag)
            .count();
        assert_eq!(starts, 1, "{tag} started {starts} times: {events:?}");
    }
}

/// A worker's pass claims ahead beyond its free slots only on the default
/// queue: a named queue's instance claimed there would wait for a slot
/// while its queue counts it running, so another worker could not run it
/// (and its lease might lapse meanwhile). Here a worker running one at a
/// time is busy with a long default-queue run; a queued instance due beside
/// it starts on a second worker before that run ends.
async fn a_worker_claims_no_queued_instance_it_cannot_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let long = queue_job(text(&file), "long".into(), 1500)
        .on(&keiro)
        .id("default-long")
        .enqueue()
        .await
        .unwrap();
    let queued = queue_job(text(&file), "queued".into(), 0)
        .on(&keiro)
        .id("beside-queued")
        .queue(&PLAIN)
        .enqueue()
        .await
        .unwrap();
    let busy = worker_of(&keiro, 1).await;
    until_tagged(&file, "long").await;
    let other = db.keiro().await;
    let free = worker_here(&other).await;
    all_done(vec![long, queued]).await;
    busy.stop().await;
    free.stop().await;
    let events = events(&file);
    let at = |what: &str, tag: &str| {
        events
            .iter()
            .find(|e| e.what == what && e.tag == tag)
            .map(|e| e.at_us)
            .unwrap_or_else(|| panic!("no {what} of {tag}: {events:?}"))
    };
    assert!(
        at("start", "queued") < at("end", "long"),
        "the queued instance waited for the long run: {events:?}"
    );
}

/// PostgreSQL only: a queued run whose end cannot be recorded until after
/// its lease lapsed (the store refused it for a while, as in a failover)
/// does not hand its slot over: a claim counted the slot free once the
/// lease lapsed and started another instance in it, so a hand-over would
/// run two on a queue of one. The slot is freed instead, and the next
/// instance waits for the one that took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_end_recorded_after_its_lease_lapsed_hands_nothing_over() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    let (_dir, file) = events_file();
    // Long enough that a renewal delayed by a loaded machine does not lapse
    // the second's lease while it runs (which would let the third start).
    let lease = Duration::from_secs(2);
    let keiro = db.builder().lease_ttl(lease).connect().await.unwrap();
    let mut admin = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    // Every instance's end is refused until the trigger goes.
    sqlx::raw_sql(
        "CREATE FUNCTION keiro.refuse_ends() RETURNS trigger AS $$ BEGIN \
           RAISE EXCEPTION 'the server is starting up' USING ERRCODE = '57P03'; END $$ \
         LANGUAGE plpgsql; \
         CREATE TRIGGER refuse_ends BEFORE UPDATE ON keiro.workflows FOR EACH ROW \
           WHEN (NEW.status = 'completed') EXECUTE FUNCTION keiro.refuse_ends();",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let enqueue = |tag: &str, ms: u64, priority: i64| {
        let call = queue_job(text(&file), tag.into(), ms).on(&keiro);
        let call = call.id(format!("lapsed-{tag}")).queue(&ONE_AT_A_TIME);
        call.priority(priority).enqueue()
    };
    let mut handles = vec![
        enqueue("first", 100, 5).await.unwrap(),
        enqueue("third", 100, 9).await.unwrap(),
    ];
    let options = ResumeOptions::default()
        .poll_interval(Duration::from_millis(20))
        .concurrency(1);
    let one = keiro.resume_worker(options.clone()).await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !events(&file)
        .iter()
        .any(|e| e.what == "end" && e.tag == "first")
    {
        assert!(Instant::now() < deadline, "the first never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first run's end is refused past its lease's lapse; then another
    // worker's claim counts the slot free and starts the second, ahead of
    // the first in run order.
    handles.push(enqueue("second", 3000, 0).await.unwrap());
    let other = db.builder().lease_ttl(lease).connect().await.unwrap();
    let two = other.resume_worker(options).await.unwrap();
    until_tagged(&file, "second").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::raw_sql("DROP TRIGGER refuse_ends ON keiro.workflows")
        .execute(&mut admin)
        .await
        .unwrap();
    all_done(handles).await;
    one.stop().await;
    two.stop().await;
    let events = events(&file);
    assert_eq!(max_in_flight(&events).0, 1, "{events:?}");
}

/// A run cancelled from another process goes on until its next lease
/// renewal finds out; until it has stopped, its instance still holds its
/// slot, so the queue starts no other beside it.
async fn a_cancelled_run_holds_its_slot_until_it_has_stopped(backend: Backend) {
    cancelled_run_holds_its_slot(backend, &ONE_AT_A_TIME).await;
}

/// As above, of a worker's slot on a queue limited per worker: the worker
/// counts its cancelled run until it has stopped.
async fn a_cancelled_run_holds_its_worker_slot_until_it_has_stopped(backend: Backend) {
    cancelled_run_holds_its_slot(backend, &PER_WORKER_1).await;
}

/// Runs a job on `queue` (one slot) in a worker, cancels it from another
/// runtime and enqueues another: the second starts only after the first
/// has stopped.
async fn cancelled_run_holds_its_slot(backend: Backend, queue: &'static keiro::Queue) {
    let db = TestDb::new(backend).await;
    let (_dir, file) = events_file();
    // Renewed every second: the run learns of the cancel within one.
    let runner = renewing_every_second(&db).await;
    // Another runtime, as another process: its cancel reaches the run only
    // through the store.
    let operator = db.keiro().await;
    let job = |call: keiro::WorkflowCall<Result<String, String>>, id: &str| {
        call.on(&operator).id(id.to_owned()).queue(queue)
    };
    job(held_job(text(&file), "held".into()), "held")
        .enqueue()
        .await
        .unwrap();
    let worker = worker_of(&runner, 4).await;
    until_tagged(&file, "held").await;
    operator.cancel("held").await.unwrap();
    let next = job(queue_job(text(&file), "next".into(), 1), "next")
        .enqueue()
        .await
        .unwrap();
    all_done(vec![next]).await;
    worker.stop().await;
    let events = events(&file);
    let at = |what: &str, tag: &str| first_at(&events, what, tag);
    assert!(
        at("end", "held") <= at("start", "next"),
        "the next job started before the cancelled run stopped: {events:?}"
    );
    assert_eq!(max_in_flight(&events).0, 1, "{events:?}");
}

/// A worker told to drain (`shutdown_within`) while a queued run is in
/// flight lets the run finish, but its end hands the slot over to nobody:
/// a draining worker takes on no new instance (it would have to stop it and
/// give it back), so the next waits for another worker.
async fn a_draining_worker_hands_no_slot_over(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (dir, file) = events_file();
    let gate = text(&dir.path().join("gate"));
    let keiro = db.keiro().await;
    let enqueue = |tag: &str| {
        gated_job(text(&file), tag.into(), gate.clone())
            .on(&keiro)
            .id(tag.to_owned())
            .queue(&ONE_AT_A_TIME)
            .enqueue()
    };
    let first = enqueue("draining-first").await.unwrap();
    let worker = worker_here(&keiro).await;
    until_seen(&file, "start", "draining-first", 1).await;
    enqueue("draining-next").await.unwrap();
    let draining = tokio::spawn(worker.shutdown_within(PATIENCE));
    // Draining by now: the worker claims nothing more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&gate, "open").unwrap();
    let out = tokio::time::timeout(PATIENCE, first.result())
        .await
        .expect("the run in flight ends while its worker drains")
        .unwrap();
    assert_eq!(out, Ok("draining-first".to_owned()));
    draining.await.unwrap();
    let events = events(&file);
    assert!(
        !events.iter().any(|e| e.tag == "draining-next"),
        "the draining worker started the next instance: {events:?}"
    );
    // Its slot is free: another worker starts the next at once.
    let other = db.keiro().await;
    let next = other
        .handle::<Result<String, String>>("draining-next")
        .await
        .unwrap();
    let worker = worker_here(&other).await;
    let out = tokio::time::timeout(PATIENCE, next.result())
        .await
        .expect("another worker runs the next")
        .unwrap();
    assert_eq!(out, Ok("draining-next".to_owned()));
    worker.stop().await;
}

/// Waits until `file` holds `n` events `what` of job `tag`.
async fn until_seen(file: &Path, what: &str, tag: &str, n: usize) {
    let deadline = Instant::now() + PATIENCE;
    while events(file)
        .iter()
        .filter(|e| e.what == what && e.tag == tag)
        .count()
        < n
    {
        assert!(
            Instant::now() < deadline,
            "job {tag} never reached {what} {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Retried at once after a cancel, an instance does not run again until
/// its cancelled run (in another process, which learns of the cancel only
/// at its next lease renewal) has stopped: the two runs of one instance
/// never overlap, nor run two on a queue of one.
async fn a_retried_instance_waits_for_its_cancelled_run_to_stop(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_dir, file) = events_file();
    // Two runtimes with workers, as two processes (either may take the
    // retried instance), renewing every second.
    let mut workers = Vec::new();
    for _ in 0..2 {
        let runner = renewing_every_second(&db).await;
        workers.push(worker_of(&runner, 4).await);
    }
    let operator = db.keiro().await;
    held_job(text(&file), "held".into())
        .on(&operator)
        .id("held")
        .queue(&ONE_AT_A_TIME)
        .enqueue()
        .await
        .unwrap();
    until_tagged(&file, "held").await;
    operator.cancel("held").await.unwrap();
    operator.retry("held").await.unwrap();
    until_seen(&file, "start", "held", 2).await;
    operator.cancel("held").await.unwrap();
    until_seen(&file, "end", "held", 2).await;
    for worker in workers {
        worker.stop().await;
    }
    let events = events(&file);
    let starts: Vec<i64> = events
        .iter()
        .filter(|e| e.what == "start")
        .map(|e| e.at_us)
        .collect();
    assert!(
        first_at(&events, "end", "held") <= starts[1],
        "the retried run started before the cancelled one stopped: {events:?}"
    );
    assert_eq!(max_in_flight(&events).0, 1, "{events:?}");
}

/// A run that times itself out at its deadline frees its queue slot as it
/// stops, not when its lease would have lapsed.
async fn a_timed_out_run_frees_its_slot_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_dir, file) = events_file();
    let lease = Duration::from_secs(30);
    let keiro = db.builder().lease_ttl(lease).connect().await.unwrap();
    let job = |call: keiro::WorkflowCall<Result<String, String>>, id: &str| {
        call.on(&keiro).id(id.to_owned()).queue(&ONE_AT_A_TIME)
    };
    job(held_job(text(&file), "late".into()), "late")
        .timeout(Duration::from_secs(1))
        .enqueue()
        .await
        .unwrap();
    let next = job(queue_job(text(&file), "next".into(), 1), "next")
        .enqueue()
        .await
        .unwrap();
    let worker = worker_here(&keiro).await;
    all_done(vec![next]).await;
    worker.stop().await;
    let events = events(&file);
    let at = |what: &str, tag: &str| first_at(&events, what, tag);
    let (stopped, started) = (at("end", "late"), at("start", "next"));
    assert!(stopped <= started, "{events:?}");
    assert!(
        started - at("start", "late") < 10_000_000,
        "the next job waited for the timed-out one's lease: {events:?}"
    );
}

/// A queued instance whose deadline passes while it waits for a slot ends
/// as timed out then, not once the queue gives it one (also by a worker
/// whose every slot is taken): its caller learns at the deadline, and the
/// expired instance takes neither a slot nor a start of the queue's (on a
/// rate-limited queue it would have counted as one).
async fn a_queued_instance_times_out_at_its_deadline_while_it_waits(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_dir, file) = events_file();
    let keiro = db.keiro().await;
    let job = |call: keiro::WorkflowCall<Result<String, String>>, id: &str| {
        call.on(&keiro).id(id.to_owned()).queue(&ONE_AT_A_TIME)
    };
    job(held_job(text(&file), "holder".into()), "holder")
        .enqueue()
        .await
        .unwrap();
    // One slot, which the holder takes: the worker starts no pass while
    // it runs, and ends the expired instance all the same.
    let worker = worker_of(&keiro, 1).await;
    until_tagged(&file, "holder").await;
    let enqueued = Instant::now();
    let waiting = job(queue_job(text(&file), "expired".into(), 1), "expired")
        .timeout(Duration::from_millis(300))
        .enqueue()
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting.result())
        .await
        .expect("the caller learns of the time-out while the slot is still held");
    assert!(
        matches!(outcome, Err(Error::TimedOut { .. })),
        "{outcome:?}"
    );
    assert!(enqueued.elapsed() >= Duration::from_millis(300));
    keiro.cancel("holder").await.unwrap();
    worker.stop().await;
    let events = events(&file);
    assert!(
        !events.iter().any(|e| e.tag == "expired"),
        "the expired instance ran: {events:?}"
    );
    // The holder's start only.
    let starts = recorded_starts(&db, backend, ONE_AT_A_TIME.name()).await;
    assert_eq!(starts.len(), 1, "the expired instance counted as a start");
}

async fn starting_or_awaiting_an_enqueued_id_leaves_it_to_its_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    let job = |id: &str| {
        queue_job(text(&file), id.to_owned(), 1)
            .on(&keiro)
            .id(id.to_owned())
    };
    // One on a queue, one delayed on the default queue: neither may start
    // for a minute, whoever asks for its id.
    job("queued")
        .queue(&ONE_AT_A_TIME)
        .delay(Duration::from_secs(60))
        .enqueue()
        .await
        .unwrap();
    job("delayed")
        .delay(Duration::from_secs(60))
        .enqueue()
        .await
        .unwrap();
    for id in ["queued", "delayed"] {
        let handle = job(id).start().await.unwrap();
        assert_eq!(handle.id(), id);
        let awaited = tokio::time::timeout(Duration::from_millis(300), job(id).into_future()).await;
        assert!(awaited.is_err(), "{id}: awaiting it ran it: {awaited:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            keiro.summary(id).await.unwrap().status,
            keiro::WorkflowStatus::Pending,
            "{id}"
        );
    }
    assert!(events(&file).is_empty(), "{:?}", events(&file));
}

async fn priority_holds_across_the_workflows_of_a_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (dir, file) = events_file();
    let gate = dir.path().join("open");
    std::fs::write(&gate, "").unwrap();
    let worker = worker_here(&keiro).await;
    // A backlog of one workflow at priority 5, one at a time.
    let mut handles = Vec::new();
    for n in 0..6 {
        let call = queue_job(text(&file), format!("bulk-{n}"), 300).on(&keiro);
        let call = call
            .id(format!("bulk-{n}"))
            .queue(&ONE_AT_A_TIME)
            .priority(5);
        handles.push(call.enqueue().await.unwrap());
    }
    let deadline = Instant::now() + PATIENCE;
    while events(&file).is_empty() {
        assert!(Instant::now() < deadline, "no job started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another workflow's instance at priority 0 runs next, not after the
    // backlog the running one would otherwise hand its slot along.
    let urgent = gated_job(text(&file), "urgent".into(), text(&gate))
        .on(&keiro)
        .id("urgent")
        .queue(&ONE_AT_A_TIME)
        .priority(0)
        .enqueue()
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, urgent.result())
        .await
        .expect("urgent ends in time")
        .unwrap()
        .unwrap();
    all_done(handles).await;
    worker.stop().await;
    let events = events(&file);
    let urgent_at = events
        .iter()
        .position(|e| e.tag == "urgent")
        .expect("urgent ran");
    let bulk_before = events[..urgent_at]
        .iter()
        .filter(|e| e.what == "start" && e.tag.starts_with("bulk-"))
        .count();
    assert!(
        bulk_before <= 2,
        "{bulk_before} of the backlog started before the higher priority: {events:?}"
    );
}

async fn a_fork_of_a_queued_instance_stays_on_its_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let (_dir, file) = events_file();
    queue_job(text(&file), "src".into(), 1)
        .on(&keiro)
        .id("src")
        .queue(&ONE_AT_A_TIME)
        .partition("customer-7")
        .priority(3)
        .dedup("k")
        .enqueue()
        .await
        .unwrap();
    let fork = keiro.fork("src", keiro::ForkFrom::Step(0)).await.unwrap();
    let summary = keiro.summary(&fork).await.unwrap();
    assert_eq!(
        summary.queue.as_deref(),
        Some("test-one-at-a-time"),
        "{summary:?}"
    );
    // It runs only through its queue: claiming its id leaves it alone.
    let store = keiro::unstable::raw_store(&keiro);
    let lease = keiro_store::Lease {
        owner: "someone",
        ttl_us: 60_000_000,
    };
    assert!(store.claim(&fork, lease).await.unwrap().is_none());
    assert_eq!(
        recorded_partition(&db, backend, &fork).await,
        ("customer-7".into(), 3)
    );
}

/// The partition key and priority stored for instance `id`.
async fn recorded_partition(db: &TestDb, backend: Backend, id: &str) -> (String, i64) {
    let sql = "SELECT partition_key, priority FROM {t} WHERE id = $1";
    match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query_as(&sql.replace("{t}", "keiro_workflows"))
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
        Backend::Postgres | Backend::PgBouncer => {
            let pool = sqlx::PgPool::connect(&db.direct_url).await.unwrap();
            sqlx::query_as(&sql.replace("{t}", "keiro.workflows"))
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    }
}

// Declared in this test binary only: the `queue_worker` processes do not
// link it.
keiro::queue!(
    HERE_ONLY = "declared-in-the-test-binary-only",
    concurrency = 2
);

/// An instance on a queue that the live workers serving its workflow do not
/// declare is not left waiting in silence: following it ends in
/// `Error::NoQueueWorker` naming the queue, and it stays pending until a
/// worker declaring the queue runs it.
async fn an_instance_on_a_queue_no_worker_declares_is_reported(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .no_worker_timeout(Duration::from_millis(1500))
        .connect()
        .await
        .unwrap();
    let workers = worker_processes(&db, 1, 2).await;
    let (_dir, file) = events_file();
    let handle = queue_job(text(&file), "stranded".into(), 0)
        .on(&keiro)
        .id("stranded")
        .queue(&HERE_ONLY)
        .enqueue()
        .await
        .unwrap();
    // The workers serve the workflow: one on a queue they declare runs.
    let served = queue_job(text(&file), "served".into(), 0)
        .on(&keiro)
        .id("served")
        .queue(&PLAIN)
        .enqueue()
        .await
        .unwrap();
    all_done(vec![served]).await;
    let error = tokio::time::timeout(PATIENCE, handle.result())
        .await
        .expect("the caller is told in time")
        .unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(&error, Error::NoQueueWorker { queue, id, .. }
            if queue == "declared-in-the-test-binary-only" && id == "stranded"),
        "{text}"
    );
    assert!(text.contains("keiro::queue!"), "{text}");
    assert_eq!(
        handle.status().await.unwrap(),
        keiro::WorkflowStatus::Pending
    );
    // A worker declaring the queue runs it.
    let here = worker_here(&keiro).await;
    all_done(vec![handle]).await;
    here.stop().await;
    for worker in workers {
        worker.kill().await;
    }
}

/// A worker that starts while another live worker declares one of its
/// queues with other limits (mid-deploy) reports it once, naming both.
async fn a_worker_reports_a_live_worker_with_other_limits(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    let other = keiro_store::ExecutorRow {
        id: "older-deploy".into(),
        token: "t".into(),
        host: "elsewhere".into(),
        pid: 1,
        heartbeat_at: keiro_store::now_us(),
    };
    assert!(store.put_executor(&other, None).await.unwrap());
    let theirs = [
        ("test-concurrency-2", "concurrency 5"),
        ("test-plain", "no limits"),
    ];
    store
        .register_workflows("older-deploy", &[], &theirs)
        .await
        .unwrap();
    let reported = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = reported.clone();
    let worker = keiro
        .resume_worker(
            ResumeOptions::default()
                .poll_interval(Duration::from_millis(20))
                .log(move |event| {
                    if let keiro::ResumeEvent::QueueLimitsDiffer {
                        queue,
                        executor,
                        theirs,
                        ours,
                    } = event
                    {
                        log.lock().unwrap().push((
                            queue.clone(),
                            executor.clone(),
                            theirs.clone(),
                            ours.clone(),
                        ));
                    }
                }),
        )
        .await
        .unwrap();
    // The worker registers at its first pass; a job run shows it passed.
    let (_dir, file) = events_file();
    let job = queue_job(text(&file), "limits".into(), 0)
        .on(&keiro)
        .id("limits")
        .enqueue()
        .await
        .unwrap();
    all_done(vec![job]).await;
    worker.stop().await;
    let reported = reported.lock().unwrap().clone();
    assert_eq!(
        reported,
        [(
            "test-concurrency-2".to_owned(),
            "older-deploy".to_owned(),
            "concurrency 5".to_owned(),
            "concurrency 2".to_owned(),
        )]
    );
}

/// A retention shorter than a queue's rate-limit period is refused, by
/// `gc` and by a worker that would run it: the window counts the starts
/// recorded on finished instances, which gc would delete.
async fn a_retention_shorter_than_a_rate_window_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let short = keiro::Retention::finished_older_than(Duration::from_millis(500));
    let error = keiro.gc(&short).await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error, Error::InvalidOption { .. })
            && (text.contains("`test-rate-20`") && text.contains("20 per 1s")
                || text.contains("`test-one-in-30s`") && text.contains("1 per 30s")),
        "{text}"
    );
    let error = keiro
        .resume_worker(ResumeOptions::default().retention(short))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidOption { .. }), "{error}");
    // Failed ones kept shorter are refused the same way.
    let failed_short = keiro::Retention::finished_older_than(Duration::from_secs(3600))
        .failed_older_than(Duration::from_millis(10));
    assert!(keiro.gc(&failed_short).await.is_err());
    let enough = keiro::Retention::finished_older_than(Duration::from_secs(30));
    keiro.gc(&enough).await.unwrap();
}

on_both_backends!(
    a_queued_instance_times_out_at_its_deadline_while_it_waits,
    a_draining_worker_hands_no_slot_over,
    a_cancelled_run_holds_its_slot_until_it_has_stopped,
    a_cancelled_run_holds_its_worker_slot_until_it_has_stopped,
    a_timed_out_run_frees_its_slot_at_once,
    a_retried_instance_waits_for_its_cancelled_run_to_stop,
    enqueues_made_at_once_run_in_the_order_made,
    a_worker_claims_no_queued_instance_it_cannot_start,
    a_retention_shorter_than_a_rate_window_is_refused,
    a_rate_limit_holds_back_new_starts_not_resumes,
    a_worker_reports_a_live_worker_with_other_limits,
    an_instance_on_a_queue_no_worker_declares_is_reported,
    a_fork_of_a_queued_instance_stays_on_its_queue,
    priority_holds_across_the_workflows_of_a_queue,
    starting_or_awaiting_an_enqueued_id_leaves_it_to_its_queue,
    a_dedup_key_taken_meanwhile_refuses_retry_and_resume_but_not_an_attach,
    an_instance_waiting_past_its_lease_is_not_run_twice,
    a_spawned_child_with_queue_settings_is_refused,
    concurrency_holds_across_worker_processes,
    worker_concurrency_holds_per_process,
    rate_limit_spaces_starts,
    lower_priority_runs_first_fifo_among_equals,
    a_busy_partition_does_not_block_another,
    a_handed_over_instance_resumes_from_its_journal,
    dedup_refuses_while_unfinished_and_accepts_after,
    delay_is_respected_on_a_queue_and_the_default_queue,
    queue_settings_need_an_enqueue_and_a_queue,
    refills_do_not_starve_a_small_pool,
    a_busy_queue_leaves_room_for_the_default_queue,
    a_busy_queue_leaves_room_for_another_queue,
    a_busy_default_queue_leaves_room_for_a_queue,
);
