//! Executor identities and clean shutdown, on both backends: processes of one
//! program share a host with no setting (real child processes), a restart
//! takes over its dead predecessors' leases at once, an explicit identity
//! stays exclusive, and a clean shutdown hands work and identity on at once.

use std::time::{Duration, Instant};

use keiro::{Error, Keiro, ResumeOptions};
use keiro_store::{InstanceRow, InstanceStatus};
use keiro_tests::executors::{brief, held, wait_for_file};
use keiro_tests::process::CrashChild;
use keiro_tests::{on_both_backends, Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_executor_process");

/// Far longer than any wait below: work resumed within a test was handed on,
/// not left to lapse.
const LONG_LEASE: Duration = Duration::from_secs(60);

fn quiet() -> ResumeOptions {
    ResumeOptions::default()
        .poll_interval(Duration::from_millis(50))
        .log(|_| {})
}

async fn explicit(db: &TestDb, id: &str) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(id)
        .lease_ttl(LONG_LEASE)
        .connect()
        .await
        .unwrap()
}

/// Polls the store until instance `id` is final (30 s at most).
async fn wait_final(keiro: &Keiro, id: &str) -> InstanceRow {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = keiro.store().get_instance(id).await.unwrap().unwrap();
        if row.status.is_final() {
            return row;
        }
        assert!(Instant::now() < deadline, "{id} is still {:?}", row.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The process id a completed `held` or `brief` instance returned.
fn pid_of(row: &InstanceRow) -> u32 {
    assert_eq!(row.status, InstanceStatus::Completed, "{row:?}");
    serde_json::from_str(row.output.as_deref().unwrap()).unwrap()
}

/// The unfinished instance kept its status and attempts and holds no lease.
async fn assert_released(keiro: &Keiro, id: &str) {
    let row = keiro.store().get_instance(id).await.unwrap().unwrap();
    assert!(!row.status.is_final(), "{row:?}");
    assert_eq!(row.lease_owner, None, "{row:?}");
    assert_eq!(row.attempts, 0, "a shutdown counted as a crash: {row:?}");
}

async fn ready(child: &mut CrashChild) -> String {
    let line = child.line_starting("READY").await;
    line.split_once(' ').unwrap().1.to_owned()
}

async fn processes_share_a_host_and_a_restart_takes_over_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = |name: &str| dir.path().join(name).display().to_string();
    let lease = LONG_LEASE.as_millis().to_string();

    // Two workers and an in-process run of one program on one host, none
    // with KEIRO_EXECUTOR_ID: each takes its own numbered identity.
    let mut first = CrashChild::start_default(BIN, &db, &["worker", &lease]);
    let first_id = ready(&mut first).await;
    let mut second = CrashChild::start_default(BIN, &db, &["worker", &lease]);
    let second_id = ready(&mut second).await;
    assert!(first_id.ends_with("/executor_process"), "{first_id}");
    assert_eq!(second_id, format!("{first_id}#2"));
    std::fs::write(marker("quick"), "").unwrap();
    let mut api = CrashChild::start_default(BIN, &db, &["run", &marker("quick")]);
    let done = api.line_starting("DONE").await;
    assert!(done.ends_with(&format!(" {first_id}#3")), "{done}");
    assert!(api.exit_success().await);

    // Both workers run long work at the same time, each under its identity.
    let keiro = db.keiro().await;
    for id in ["one", "two"] {
        held(marker(id)).id(id).on(&keiro).enqueue().await.unwrap();
    }
    wait_for_file(&dir.path().join("one")).await;
    wait_for_file(&dir.path().join("two")).await;
    let mut owners = Vec::new();
    for id in ["one", "two"] {
        let row = keiro.store().get_instance(id).await.unwrap().unwrap();
        owners.push(row.lease_owner.unwrap());
    }
    owners.sort();
    assert_eq!(owners, [first_id.clone(), second_id.clone()]);

    // Both die. One restart takes the first identity with its leases and
    // releases the second's: all the work resumes long before the leases
    // (60 s) lapse.
    first.kill().await;
    second.kill().await;
    let restarted_at = Instant::now();
    let mut restarted = CrashChild::start_default(BIN, &db, &["worker", &lease]);
    assert_eq!(ready(&mut restarted).await, first_id);
    let pid = restarted.pid();
    for id in ["one", "two"] {
        assert_eq!(pid_of(&wait_final(&keiro, id).await), pid, "{id}");
    }
    assert!(
        restarted_at.elapsed() < Duration::from_secs(20),
        "took {:?}: the leases were waited out",
        restarted_at.elapsed()
    );
    restarted.kill().await;
}

async fn an_explicit_identity_stays_exclusive_across_processes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let lease = LONG_LEASE.as_millis().to_string();
    let mut holder = CrashChild::start(BIN, &db, "billing", &["worker", &lease], None);
    assert_eq!(ready(&mut holder).await, "billing");
    let refused = CrashChild::start(BIN, &db, "billing", &["worker", &lease], None);
    assert!(
        !refused.exit_success().await,
        "a second live process took `billing`"
    );
    holder.kill().await;
    let mut restarted = CrashChild::start(BIN, &db, "billing", &["worker", &lease], None);
    assert_eq!(ready(&mut restarted).await, "billing");
    restarted.kill().await;
}

async fn runtimes_without_an_id_take_numbered_identities(backend: Backend) {
    let db = TestDb::new(backend).await;
    let a = Keiro::connect(&db.url).await.unwrap();
    let b = Keiro::connect(&db.url).await.unwrap();
    a.resume_once(&quiet()).await.unwrap();
    b.resume_once(&quiet()).await.unwrap();
    assert_eq!(b.executor_id(), format!("{}#2", a.executor_id()));

    let x = explicit(&db, "orders").await;
    x.resume_once(&quiet()).await.unwrap();
    let y = explicit(&db, "orders").await;
    match y.resume_once(&quiet()).await {
        Err(Error::ExecutorIdInUse { id, .. }) => assert_eq!(id, "orders"),
        other => panic!("expected ExecutorIdInUse, got {other:?}"),
    }
}

async fn a_worker_shutdown_is_prompt_and_hands_work_and_identity_on(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("m").display().to_string();
    let a = explicit(&db, "worker-a").await;
    let worker = a.resume_worker(quiet()).await.unwrap();
    held(marker.clone())
        .id("long")
        .on(&a)
        .enqueue()
        .await
        .unwrap();
    wait_for_file(dir.path().join("m").as_path()).await;

    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), worker.shutdown())
        .await
        .expect("the shutdown waited for the run in flight");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_released(&a, "long").await;
    assert!(a.store().get_executor("worker-a").await.unwrap().is_none());

    // Another worker resumes it at once; the identity is free at once.
    let b = db.builder().lease_ttl(LONG_LEASE).connect().await.unwrap();
    let pass = b.resume_once(&quiet()).await.unwrap();
    assert_eq!((pass.resumed, pass.completed), (1, 1), "{pass:?}");
    assert_eq!(pid_of(&wait_final(&b, "long").await), std::process::id());
    let again = explicit(&db, "worker-a").await;
    again.resume_once(&quiet()).await.unwrap();

    // The shut-down runtime runs nothing more.
    match brief(1).on(&a).await {
        Err(Error::ShutDown { executor }) => assert_eq!(executor, "worker-a"),
        other => panic!("expected ShutDown, got {other:?}"),
    }
}

async fn keiro_shutdown_stops_started_runs_and_releases_them(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("m").display().to_string();
    let a = explicit(&db, "api").await;
    let handle = held(marker).id("started").on(&a).start().await.unwrap();
    let waiter = tokio::spawn(async move { handle.result().await });
    wait_for_file(dir.path().join("m").as_path()).await;

    tokio::time::timeout(Duration::from_secs(10), a.shutdown())
        .await
        .expect("the shutdown waited for the run")
        .unwrap();
    match waiter.await.unwrap() {
        Err(Error::Stopped { name, id }) => {
            assert_eq!((name.as_str(), id.as_str()), ("held", "started"))
        }
        other => panic!("expected Stopped, got {other:?}"),
    }
    assert_released(&a, "started").await;
    a.shutdown().await.unwrap();

    let b = db.builder().lease_ttl(LONG_LEASE).connect().await.unwrap();
    let pass = b.resume_once(&quiet()).await.unwrap();
    assert_eq!((pass.resumed, pass.completed), (1, 1), "{pass:?}");
    explicit(&db, "api")
        .await
        .resume_once(&quiet())
        .await
        .unwrap();
}

async fn a_grace_period_lets_runs_in_flight_finish(backend: Backend) {
    let db = TestDb::new(backend).await;
    let a = explicit(&db, "graceful").await;
    let worker = a.resume_worker(quiet()).await.unwrap();
    brief(400).id("brief").on(&a).enqueue().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a
        .store()
        .get_instance("brief")
        .await
        .unwrap()
        .unwrap()
        .status
        != InstanceStatus::Running
    {
        assert!(Instant::now() < deadline, "the worker never claimed it");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown_within(Duration::from_secs(10)).await;
    let row = a.store().get_instance("brief").await.unwrap().unwrap();
    assert_eq!(pid_of(&row), std::process::id());
    assert!(a.store().get_executor("graceful").await.unwrap().is_none());
}

on_both_backends!(
    processes_share_a_host_and_a_restart_takes_over_at_once,
    an_explicit_identity_stays_exclusive_across_processes,
    runtimes_without_an_id_take_numbered_identities,
    a_worker_shutdown_is_prompt_and_hands_work_and_identity_on,
    keiro_shutdown_stops_started_runs_and_releases_them,
    a_grace_period_lets_runs_in_flight_finish,
);
