//! The kill campaign: 2,000 enqueued workflows of 5 steps, two worker
//! processes SIGKILLed alternately every 2 s for 20 s (each restarted at once
//! under its identity), then drained. Every workflow completes, every step is
//! journaled once, and no step body starts after its result was journaled
//! (each body checks the journal on entry; see `keiro_tests::faults`).
//! `--ignored` runs the 10,000-workflow version, killing for 60 s.

use std::time::{Duration, Instant};

use futures::StreamExt;
use keiro_tests::faults::{
    assert_no_journaled_step_ran_again, checked_steps, journal_results, wait_all_completed,
    FaultWorker,
};
use keiro_tests::{on_both_backends, Backend, TestDb};

const WORKER: &str = env!("CARGO_BIN_EXE_fault_worker");
const STEPS: u32 = 5;
/// How long each step body takes: keeps work in flight across the kills.
const PAUSE_MS: u64 = 40;
const KILL_EVERY: Duration = Duration::from_secs(2);

/// Runs `workflows` workflows while killing a worker every 2 s, `kills` times,
/// then drains them within `drain`.
async fn campaign(backend: Backend, workflows: usize, kills: usize, drain: Duration) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.log");
    let log_text = log.to_str().unwrap().to_owned();
    // This process only enqueues and reads: it runs nothing.
    let keiro = db.keiro().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let executors = [format!("kill-a-{run}"), format!("kill-b-{run}")];
    let mut workers = Vec::new();
    for executor in &executors {
        workers.push(Some(
            FaultWorker::start(WORKER, &db.url, executor, None).await,
        ));
    }

    let started = Instant::now();
    let ids: Vec<String> = (0..workflows).map(|w| format!("wf-{w}")).collect();
    futures::stream::iter(ids.iter().cloned())
        .map(|id| {
            let call = checked_steps(id.clone(), STEPS, log_text.clone(), PAUSE_MS)
                .id(id)
                .on(&keiro);
            async move { call.enqueue().await.map(|_| ()) }
        })
        .buffer_unordered(64)
        .for_each(|enqueued| async move { enqueued.expect("enqueue") })
        .await;

    for kill in 0..kills {
        tokio::time::sleep(KILL_EVERY).await;
        let slot = kill % 2;
        eprintln!(
            "kill {kill}: {:?}",
            keiro_tests::faults::status_counts(&keiro).await
        );
        workers[slot].take().unwrap().kill().await;
        workers[slot] = Some(FaultWorker::start(WORKER, &db.url, &executors[slot], None).await);
    }
    let killed_at = started.elapsed();

    wait_all_completed(&keiro, workflows, drain).await;
    let drained_at = started.elapsed();
    for worker in workers.into_iter().flatten() {
        worker.kill().await;
    }

    let reruns = assert_no_journaled_step_ran_again(&log, &ids, STEPS);
    let results = journal_results(&keiro).await.unwrap();
    assert_eq!(
        results.len(),
        workflows * STEPS as usize,
        "one journal row per step"
    );
    // Every workflow's output is what its journal holds.
    for id in ids.iter().step_by(97) {
        let handle = keiro.handle::<Vec<String>>(id).await.unwrap();
        let out = handle.result().await.unwrap();
        let journaled: Vec<String> = results
            .iter()
            .filter(|(w, _, _)| w == id)
            .map(|(_, _, r)| serde_json::from_str(r).unwrap())
            .collect();
        assert_eq!(out, journaled, "workflow {id}");
    }
    eprintln!(
        "{{\"backend\":\"{backend:?}\",\"workload\":\"kill_campaign\",\"workflows\":{workflows},\
         \"kills\":{kills},\"reruns\":{reruns},\"kills_done_s\":{:.1},\"drained_s\":{:.1}}}",
        killed_at.as_secs_f64(),
        drained_at.as_secs_f64()
    );
}

async fn two_thousand_workflows_survive_a_worker_killed_every_two_seconds(backend: Backend) {
    campaign(backend, 2_000, 10, Duration::from_secs(90)).await;
}

on_both_backends!(two_thousand_workflows_survive_a_worker_killed_every_two_seconds);

mod long {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "the 10,000-workflow kill campaign takes minutes; run with --ignored"]
    async fn ten_thousand_workflows_on_sqlite() {
        campaign(Backend::Sqlite, 10_000, 30, Duration::from_secs(600)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "the 10,000-workflow kill campaign takes minutes; run with --ignored"]
    async fn ten_thousand_workflows_on_postgres() {
        campaign(Backend::Postgres, 10_000, 30, Duration::from_secs(600)).await;
    }
}
