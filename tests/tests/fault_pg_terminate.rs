//! Connections terminated under a running resume worker: every backend of the
//! app's database (the worker's pool, its `LISTEN` connection, the test's own
//! runtime) is killed with `pg_terminate_backend` four times while one worker
//! process drives 96 workflows of 5 steps. Every workflow completes without
//! restarting the worker, and no step body starts after its result was
//! journaled.

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

    let mut terminated = Vec::new();
    for _ in 0..TERMINATIONS {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap();
        terminated.push(killed.len());
    }
    let after = status_counts(&keiro).await;

    wait_all_completed(&keiro, WORKFLOWS, Duration::from_secs(90)).await;
    assert!(worker.is_running(), "the worker process died on the way");
    assert!(
        terminated.iter().all(|&n| n > 0),
        "every round terminated backends: {terminated:?}"
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
