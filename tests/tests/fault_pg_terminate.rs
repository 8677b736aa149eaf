//! Connections terminated under a running resume worker: every backend of the
//! app's database (the worker's pool, its `LISTEN` connection, the test's own
//! runtime) is killed with `pg_terminate_backend` four times while one worker
//! process drives 96 workflows of 5 steps. Every workflow completes without
//! restarting the worker, and no step body starts after its result was
//! journaled. And a worker whose `LISTEN` connection is lost while the
//! database refuses new ones looks for the work notified meanwhile as soon
//! as it listens again.

use std::time::Duration;

use futures::StreamExt;
use keiro_tests::faults::{
    assert_no_journaled_step_ran_again, checked_steps, journal_results, status_counts,
    wait_all_completed, FaultWorker,
};
use keiro_tests::{Backend, TestDb};
use sqlx::Connection;

const WORKER: &str = env!("CARGO_BIN_EXE_fault_worker");
const WORKFLOWS: usize = 96;
const STEPS: u32 = 5;
const PAUSE_MS: u64 = 300;
const TERMINATIONS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_complete_when_every_connection_is_terminated_mid_run() {
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.log");
    let log_text = log.to_str().unwrap().to_owned();
    let keiro = db.keiro().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut worker = FaultWorker::start(WORKER, &db.url, &format!("terminate-{run}"), None).await;
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();

    let ids: Vec<String> = (0..WORKFLOWS).map(|w| format!("wf-{w}")).collect();
    futures::stream::iter(ids.iter().cloned())
        .map(|id| {
            let call = checked_steps(id.clone(), STEPS, log_text.clone(), PAUSE_MS)
                .id(id)
                .on(&keiro);
            async move { call.enqueue().await.map(|_| ()) }
        })
        .buffer_unordered(32)
        .for_each(|enqueued| async move { enqueued.expect("enqueue") })
        .await;

    // Rounds that found no backend (all of them reconnecting at that
    // moment) do not count; at most 20 tries.
    let mut terminated = Vec::new();
    for _ in 0..20 {
        if terminated.len() == TERMINATIONS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap();
        if !killed.is_empty() {
            terminated.push(killed.len());
        }
    }
    let after = status_counts(&keiro).await;

    wait_all_completed(&keiro, WORKFLOWS, Duration::from_secs(90)).await;
    assert!(worker.is_running(), "the worker process died on the way");
    assert_eq!(
        terminated.len(),
        TERMINATIONS,
        "rounds that terminated backends: {terminated:?}"
    );
    let reruns = assert_no_journaled_step_ran_again(&log, &ids, STEPS);
    let results = journal_results(&keiro).await.unwrap();
    assert_eq!(
        results.len(),
        WORKFLOWS * STEPS as usize,
        "one journal row per step"
    );
    eprintln!(
        "backends terminated per round: {terminated:?}; after the last: {after:?}; \
         step bodies run more than once: {reruns}"
    );
    worker.kill().await;
}

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

/// Sessions of database `name` whose last statement was a `LISTEN`.
async fn listening(admin: &mut sqlx::PgConnection, name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'",
    )
    .bind(name)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// A worker that polls once a minute loses its `LISTEN` connection, and the
/// enqueue that should wake it is notified while it cannot listen again (the
/// database refuses new connections for a moment). Once it listens again it
/// looks for work at once instead of waiting out its poll: the notification
/// it missed costs no minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_sent_while_the_listener_is_down_is_not_waited_out() {
    use std::str::FromStr;

    let db = TestDb::new(Backend::Postgres).await;
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).unwrap();
    let name = options.get_database().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect_with(&options.database("postgres"))
        .await
        .unwrap();
    // Its LISTEN on a pool of its own (the listen URL): when that connection
    // is lost, listening again needs a new connection.
    let mut worker = tokio::process::Command::new(CHILD)
        .args(["worker", "60000"])
        .env("KEIRO_DATABASE_URL", &db.url)
        .env("KEIRO_LISTEN_URL", &db.url)
        .env(
            "KEIRO_EXECUTOR_ID",
            format!("listener-{}", uuid::Uuid::new_v4().simple()),
        )
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = worker.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    assert_eq!(ready.unwrap().unwrap().as_deref(), Some("READY"));
    let started = std::time::Instant::now();
    while listening(&mut admin, &name).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // This runtime listens on a pool of its own too, so that its listener,
    // trying to come back, never takes the connection the enqueue needs.
    let keiro = db.builder().listen_url(&db.url).connect().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log").to_str().unwrap().to_owned();
    // Pushed at once while the listener is up (and this runtime's pool
    // holds connections for the enqueue below).
    let handle = keiro_tests::workflows::three_marks(file.clone(), 1)
        .id("before")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result()).await;
    assert_eq!(out.expect("woken by its notification").unwrap(), 13);

    let allow = |on: bool| format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {on}");
    sqlx::query(&allow(false))
        .execute(&mut admin)
        .await
        .unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 \
         AND query ILIKE 'LISTEN%'",
    )
    .bind(&name)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    let handle = keiro_tests::workflows::three_marks(file, 2)
        .id("while-down")
        .on(&keiro)
        .enqueue()
        .await;
    // The listener fails to come back at least once meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query(&allow(true)).execute(&mut admin).await.unwrap();
    assert!(!killed.is_empty(), "no LISTEN session was terminated");
    let handle = handle.expect("the enqueue used a connection already open");
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result()).await;
    assert_eq!(
        out.expect("the worker waited for its one-minute poll after listening again")
            .unwrap(),
        23
    );
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    keiro.shutdown().await.unwrap();
}

/// A worker that polls once a minute is woken by an enqueue while its
/// pool's connections are gone and the database refuses new ones: its pass
/// fails. Once the database takes connections again it tries again within
/// moments (100 ms after a failed pass, doubling) instead of waiting out
/// its poll interval, and runs the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pass_is_retried_before_the_poll_interval() {
    use std::str::FromStr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let db = TestDb::new(Backend::Postgres).await;
    let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).unwrap();
    let name = options.get_database().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect_with(&options.database("postgres"))
        .await
        .unwrap();
    // Both runtimes listen on pools of their own: terminating the worker's
    // pool leaves its LISTEN, and the enqueue below its own connections.
    // A pool of at most `WORKER_POOL`: holding that many, the test knows
    // every connection it can have.
    const WORKER_POOL: u32 = 3;
    let worker = db
        .builder()
        .listen_url(&db.url)
        .max_connections(WORKER_POOL)
        .connect()
        .await
        .unwrap();
    let failures = Arc::new(AtomicUsize::new(0));
    let counted = failures.clone();
    let resume = worker
        .resume_worker(
            keiro::ResumeOptions::default()
                .poll_interval(Duration::from_secs(60))
                .log(move |event| {
                    if matches!(event, keiro::ResumeEvent::PassFailed { .. }) {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                }),
        )
        .await
        .unwrap();
    let keiro = db.builder().listen_url(&db.url).connect().await.unwrap();
    let started = std::time::Instant::now();
    while listening(&mut admin, &name).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log").to_str().unwrap().to_owned();
    let handle = keiro_tests::workflows::three_marks(file.clone(), 1)
        .id("before")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result()).await;
    assert_eq!(out.expect("woken by its notification").unwrap(), 13);

    // The server processes behind every connection of the worker's pool.
    let keiro_store::Store::Postgres(pool) = keiro::unstable::raw_store(&worker) else {
        panic!("a PostgreSQL store")
    };
    let mut held = Vec::new();
    for _ in 0..WORKER_POOL {
        held.push(pool.pool().acquire().await.unwrap());
    }
    let mut pids = Vec::new();
    for conn in &mut held {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        pids.push(pid);
    }
    drop(held);
    let allow = |on: bool| format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {on}");
    sqlx::query(&allow(false))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid")
        .bind(&pids)
        .execute(&mut admin)
        .await
        .unwrap();
    let enqueued = keiro_tests::workflows::three_marks(file.clone(), 2)
        .id("after-a-failed-pass")
        .on(&keiro)
        .enqueue()
        .await;
    // Each enqueue notifies the worker; under load its first wake may come
    // before it meets the dead pool, so nudge it until a pass has failed.
    let started = std::time::Instant::now();
    let mut nudges = 0;
    while failures.load(Ordering::SeqCst) == 0 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if started.elapsed() > Duration::from_secs(2 * (nudges + 1)) {
            nudges += 1;
            let nudge = keiro_tests::workflows::three_marks(file.clone(), 0)
                .id(format!("nudge-{nudges}"))
                .on(&keiro);
            let _ = nudge.enqueue().await;
        }
    }
    sqlx::query(&allow(true)).execute(&mut admin).await.unwrap();
    assert!(
        failures.load(Ordering::SeqCst) > 0,
        "the worker's pass did not fail"
    );
    let handle = enqueued.expect("the enqueue used a connection already open");
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result()).await;
    assert_eq!(
        out.expect("the worker waited for its one-minute poll after a failed pass")
            .unwrap(),
        23
    );
    resume.shutdown().await;
    keiro.shutdown().await.unwrap();
    worker.shutdown().await.unwrap();
}
