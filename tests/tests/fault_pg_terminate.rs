//! Connections terminated under a running resume worker: every backend of the
//! app's database (the worker's pool, its `LISTEN` connection, the test's own
//! runtime) is killed with `pg_terminate_backend` four times while one worker
//! process drives 96 workflows of 5 steps. Every workflow completes without
//! restarting the worker, and no step body starts after its result was
//! journaled. And while the database refuses new connections for a moment, a
//! worker that polls once a minute and whose `LISTEN` connection, or whose
//! pool, is terminated runs the work notified meanwhile as soon as it can,
//! not at its next poll.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keiro::{Keiro, WorkflowHandle};
use keiro_tests::faults::{
    assert_no_journaled_step_ran_again, checked_steps, journal_results, status_counts,
    wait_all_completed, FaultWorker,
};
use keiro_tests::process::CrashChild;
use keiro_tests::workflows::three_marks;
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

/// A connection to the server's `postgres` database, acting on the test
/// database `name` from outside it.
struct Admin {
    conn: sqlx::PgConnection,
    name: String,
}

impl Admin {
    async fn connect(db: &TestDb) -> Admin {
        let options = sqlx::postgres::PgConnectOptions::from_str(&db.url).unwrap();
        let name = options.get_database().unwrap().to_owned();
        let conn = sqlx::PgConnection::connect_with(&options.database("postgres"))
            .await
            .unwrap();
        Admin { conn, name }
    }

    /// Waits (30 s at most) until a session of the database has run `LISTEN`.
    async fn wait_listening(&mut self) {
        let started = std::time::Instant::now();
        loop {
            let listening: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                 AND query ILIKE 'LISTEN%'",
            )
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .unwrap();
            if listening > 0 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "nothing listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lets the database take new connections, or refuses them.
    async fn allow_connections(&mut self, on: bool) {
        let name = &self.name;
        sqlx::query(&format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {on}"))
            .execute(&mut self.conn)
            .await
            .unwrap();
    }

    /// Terminates the database's sessions with these server process ids,
    /// or with none given its `LISTEN` sessions; returns how many.
    async fn terminate(&mut self, pids: Option<&[i32]>) -> usize {
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 \
             AND CASE WHEN $2::int[] IS NULL THEN query ILIKE 'LISTEN%' \
             ELSE pid = ANY($2) END",
        )
        .bind(&self.name)
        .bind(pids)
        .fetch_all(&mut self.conn)
        .await
        .unwrap();
        killed.len()
    }
}

/// Enqueues `three_marks(file, w)` as instance `id`.
async fn enqueue_marks(
    keiro: &Keiro,
    file: &str,
    w: u32,
    id: &str,
) -> keiro::Result<WorkflowHandle<u32>> {
    three_marks(file.to_owned(), w)
        .id(id)
        .on(keiro)
        .enqueue()
        .await
}

/// The result of `three_marks` instance `handle` for workflow `w`, which
/// must come within 20 s (`late` says why it would not).
async fn marks_within_20s(handle: WorkflowHandle<u32>, w: u32, late: &str) {
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result()).await;
    assert_eq!(out.expect(late).unwrap(), w * 10 + 3);
}

/// A worker that polls once a minute loses its `LISTEN` connection, and the
/// enqueue that should wake it is notified while it cannot listen again (the
/// database refuses new connections for a moment). Once it listens again it
/// looks for work at once instead of waiting out its poll: the notification
/// it missed costs no minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_sent_while_the_listener_is_down_is_not_waited_out() {
    let db = TestDb::new(Backend::Postgres).await;
    let mut admin = Admin::connect(&db).await;
    // Its LISTEN on a pool of its own (the listen URL): when that connection
    // is lost, listening again needs a new connection.
    let executor = format!("listener-{}", uuid::Uuid::new_v4().simple());
    let env = [
        ("KEIRO_LISTEN_URL", db.url.as_str()),
        ("KEIRO_EXECUTOR_ID", executor.as_str()),
    ];
    let mut worker = CrashChild::start_with_env(CHILD, &db, &env, &["worker", "60000"]);
    worker.line_starting("READY").await;
    admin.wait_listening().await;

    // This runtime listens on a pool of its own too, so that its listener,
    // trying to come back, never takes the connection the enqueue needs.
    let keiro = db.builder().listen_url(&db.url).connect().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log").to_str().unwrap().to_owned();
    // Pushed at once while the listener is up (and this runtime's pool
    // holds connections for the enqueue below).
    let handle = enqueue_marks(&keiro, &file, 1, "before").await.unwrap();
    marks_within_20s(handle, 1, "woken by its notification").await;

    admin.allow_connections(false).await;
    let killed = admin.terminate(None).await;
    let handle = enqueue_marks(&keiro, &file, 2, "while-down").await;
    // The listener fails to come back at least once meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    admin.allow_connections(true).await;
    assert!(killed > 0, "no LISTEN session was terminated");
    let handle = handle.expect("the enqueue used a connection already open");
    let late = "the worker waited for its one-minute poll after listening again";
    marks_within_20s(handle, 2, late).await;
    worker.kill().await;
    keiro.shutdown().await.unwrap();
}

/// A worker that polls once a minute is woken by an enqueue while its
/// pool's connections are gone and the database refuses new ones: its pass
/// fails. Once the database takes connections again it tries again within
/// moments (100 ms after a failed pass, doubling) instead of waiting out
/// its poll interval, and runs the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pass_is_retried_before_the_poll_interval() {
    // A pool of at most `WORKER_POOL`: holding that many, the test knows
    // every connection it can have.
    const WORKER_POOL: u32 = 3;
    let db = TestDb::new(Backend::Postgres).await;
    let mut admin = Admin::connect(&db).await;
    // Both runtimes listen on pools of their own: terminating the worker's
    // pool leaves its LISTEN, and the enqueue below its own connections.
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
    admin.wait_listening().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log").to_str().unwrap().to_owned();
    let handle = enqueue_marks(&keiro, &file, 1, "before").await.unwrap();
    marks_within_20s(handle, 1, "woken by its notification").await;

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
    admin.allow_connections(false).await;
    let killed = admin.terminate(Some(&pids)).await;
    assert_eq!(
        killed,
        pids.len(),
        "not every pooled connection was terminated"
    );
    let enqueued = enqueue_marks(&keiro, &file, 2, "after-a-failed-pass").await;
    // Each enqueue notifies the worker; under load its first wake may come
    // before it meets the dead pool, so nudge it until a pass has failed.
    let started = std::time::Instant::now();
    let mut nudges = 0;
    while failures.load(Ordering::SeqCst) == 0 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if started.elapsed() > Duration::from_secs(2 * (nudges + 1)) {
            nudges += 1;
            let _ = enqueue_marks(&keiro, &file, 0, &format!("nudge-{nudges}")).await;
        }
    }
    admin.allow_connections(true).await;
    assert!(
        failures.load(Ordering::SeqCst) > 0,
        "the worker's pass did not fail"
    );
    let handle = enqueued.expect("the enqueue used a connection already open");
    let late = "the worker waited for its one-minute poll after a failed pass";
    marks_within_20s(handle, 2, late).await;
    resume.shutdown().await;
    keiro.shutdown().await.unwrap();
    worker.shutdown().await.unwrap();
}
