//! PostgreSQL restarted under a running resume worker: a throwaway cluster on
//! its own port (the suite's main cluster stays up) is restarted with
//! `-m immediate`, then stopped with `-m immediate` for 2 s and started again,
//! while one worker process drives 96 workflows of 5 steps. Every workflow
//! completes without restarting the worker, and no step body starts after its
//! result was journaled. A caller whose pooled connections sat idle
//! through a restart gets live ones for its next calls, and one waiting on
//! a handle through an outage gets the result once the server is back.

use std::time::Duration;

use futures::StreamExt;
use keiro::{Keiro, ResumeOptions};
use keiro_tests::faults::{
    assert_no_journaled_step_ran_again, checked_steps, journal_results, status_counts,
    wait_all_completed, FaultWorker,
};
use keiro_tests::pg_cluster::cluster_or_skip;

const WORKER: &str = env!("CARGO_BIN_EXE_fault_worker");
const WORKFLOWS: usize = 96;
const STEPS: u32 = 5;
const PAUSE_MS: u64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_complete_across_an_immediate_restart_and_an_outage() {
    let Some(cluster) =
        cluster_or_skip("workflows_complete_across_an_immediate_restart_and_an_outage")
    else {
        return;
    };
    let cluster = std::sync::Arc::new(cluster);
    let url = cluster.keiro_url();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.log");
    let log_text = log.to_str().unwrap().to_owned();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keiro = Keiro::builder(&url)
        .executor_id(format!("restart-test-{run}"))
        .connect()
        .await
        .unwrap();
    let mut worker = FaultWorker::start(WORKER, &url, &format!("restart-worker-{run}"), None).await;

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

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = status_counts(&keiro).await;
    let restarted = cluster.clone();
    tokio::task::spawn_blocking(move || restarted.restart_immediate())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mid_run = status_counts(&keiro).await;
    cluster.outage(Duration::from_secs(2)).await;

    wait_all_completed(&keiro, WORKFLOWS, Duration::from_secs(90)).await;
    assert!(worker.is_running(), "the worker process died on the way");
    let reruns = assert_no_journaled_step_ran_again(&log, &ids, STEPS);
    let results = journal_results(&keiro).await.unwrap();
    assert_eq!(
        results.len(),
        WORKFLOWS * STEPS as usize,
        "one journal row per step"
    );
    let pids: std::collections::HashSet<String> = results
        .iter()
        .map(|(_, _, r)| serde_json::from_str(r).unwrap())
        .collect();
    assert_eq!(
        pids,
        [worker.pid()].into(),
        "every step ran in the one worker"
    );
    eprintln!(
        "before the restart: {before:?}; before the outage: {mid_run:?}; \
         step bodies run more than once: {reruns}"
    );
    keiro.shutdown().await.unwrap();
    worker.kill().await;
}

/// Calls made after the server restarted while the caller's pooled
/// connections sat idle all succeed: a connection idle for a while is
/// checked before it is handed out, and replaced when the restart killed it,
/// instead of failing the call that gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_a_restart_get_live_connections() {
    let Some(cluster) = cluster_or_skip("calls_after_a_restart_get_live_connections") else {
        return;
    };
    let cluster = std::sync::Arc::new(cluster);
    let keiro = Keiro::builder(cluster.keiro_url()).connect().await.unwrap();
    // Reads at once, so the pool holds several connections.
    let reads = futures::future::join_all((0..6).map(|_| status_counts(&keiro))).await;
    for read in reads {
        read.expect("a read before the restart");
    }
    let restarted = cluster.clone();
    tokio::task::spawn_blocking(move || restarted.restart_immediate())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for n in 0..10 {
        if let Err(error) = status_counts(&keiro).await {
            panic!("read {n} after the restart failed: {error}");
        }
    }
    keiro.shutdown().await.unwrap();
}

/// A handle's `result()` reads the store until the instance ends: an outage
/// of the server meanwhile (stopped for 2 s) is waited out, not returned as
/// an error, and the result arrives once the worker finished the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_waits_through_an_outage() {
    let Some(cluster) = cluster_or_skip("a_handle_waits_through_an_outage") else {
        return;
    };
    let cluster = std::sync::Arc::new(cluster);
    let keiro = Keiro::builder(cluster.keiro_url()).connect().await.unwrap();
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(100)))
        .await
        .unwrap();
    // Due 3 s from now: after the outage below.
    let id = format!("through-{}", uuid::Uuid::new_v4().simple());
    keiro_tests::workflows::sleepy(3000)
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let handle = keiro.handle::<(u64, u64)>(&id).await.unwrap();
    let waiting = tokio::spawn(async move { handle.result().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.outage(Duration::from_secs(2)).await;
    let (before, after) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the handle returns once the instance ends")
        .unwrap()
        .expect("the outage is waited out, not returned");
    assert!(after >= before + 3000, "slept {} ms", after - before);
    worker.shutdown().await;
}

/// A queue's claim is durable before its run begins: PostgreSQL dying
/// right after it (its WAL writer slowed to 10 s, so only a commit that
/// waits for the flush is on disk) leaves the instance leased to the worker
/// running it, so no other worker claims it and runs it again (beside the
/// first, whose run learns of the loss only when a renewal fails: the
/// queue one over its limit, the step body twice at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_claim_outlives_a_crash_right_after_it() {
    use keiro_tests::queues::{events, held_job, ONE_AT_A_TIME};
    use sqlx::Connection as _;
    let Some(cluster) = cluster_or_skip("a_queue_claim_outlives_a_crash_right_after_it") else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&cluster.url("postgres"))
        .await
        .unwrap();
    for statement in [
        "ALTER SYSTEM SET wal_writer_delay = '10s'",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement).execute(&mut admin).await.unwrap();
    }
    drop(admin);
    let url = cluster.keiro_url();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events");
    let file_text = file.to_str().unwrap().to_owned();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let runtime = |who: &str| {
        Keiro::builder(&url)
            .executor_id(format!("claim-{who}-{run}"))
            .connect()
    };
    let a = runtime("a").await.unwrap();
    held_job(file_text, "r1".into())
        .id("r1")
        .on(&a)
        .queue(&ONE_AT_A_TIME)
        .enqueue()
        .await
        .unwrap();
    let options = || ResumeOptions::default().poll_interval(Duration::from_millis(20));
    let worker_a = a.resume_worker(options()).await.unwrap();
    let started = |tag: &str| {
        events(&file)
            .iter()
            .filter(|e| e.what == "start" && e.tag == tag)
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while started("r1") == 0 {
        assert!(std::time::Instant::now() < deadline, "r1 never started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _cluster = tokio::task::spawn_blocking(move || {
        cluster.restart_immediate();
        cluster
    })
    .await
    .unwrap();
    let b = runtime("b").await.unwrap();
    let worker_b = b.resume_worker(options()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let starts = started("r1");
    let _ = b.cancel("r1").await;
    worker_b.shutdown().await;
    worker_a.shutdown().await;
    assert_eq!(
        starts,
        1,
        "the crash undid r1's claim, and r1 started again: {:?}",
        events(&file)
    );
}
