//! A worker cut off from PostgreSQL for longer than its lease. Worker A (its
//! own process) reaches a throwaway cluster through a TCP proxy with a 3 s
//! lease and runs 16 workflows of 5 steps; mid-run the proxy blackholes (open
//! connections carry nothing, new ones are refused) for well over the lease.
//! Worker B (another process, direct connection) takes over and finishes every
//! workflow; then the proxy forwards again, releasing A's held writes.
//!
//! A must not journal over B: no journal row changes once A's held writes
//! arrive; every journaled step result is B's, or A's from a step A began
//! before the partition; within a workflow no A result follows
//! a B result; each workflow completed once with the journal's results; and no
//! step body (A's after the partition included) started after its result was
//! journaled.

use std::collections::HashMap;
use std::time::Duration;

use keiro::Keiro;
use keiro_tests::faults::{
    assert_no_journaled_step_ran_again, checked_steps, journal_results, step_entries,
    wait_all_completed, FaultWorker,
};
use keiro_tests::pg_cluster::cluster_or_skip;
use keiro_tests::tcp_proxy::TcpProxy;
use keiro_tests::workflows::append_line;

const WORKER: &str = env!("CARGO_BIN_EXE_fault_worker");
const WORKFLOWS: usize = 16;
const STEPS: u32 = 5;
const PAUSE_MS: u64 = 300;
const LEASE: Duration = Duration::from_secs(3);
const MARKER: &str = "PARTITION";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_partitioned_past_its_lease_does_not_journal_over_its_successor() {
    let Some(cluster) =
        cluster_or_skip("a_worker_partitioned_past_its_lease_does_not_journal_over_its_successor")
    else {
        return;
    };
    let url = cluster.keiro_url();
    let proxy = TcpProxy::start(([127, 0, 0, 1], cluster.port()).into()).await;
    let proxied_url = format!("postgres://postgres@{}/keiro_fault", proxy.addr());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.log");
    let log_text = log.to_str().unwrap().to_owned();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keiro = Keiro::builder(&url)
        .executor_id(format!("partition-test-{run}"))
        .connect()
        .await
        .unwrap();
    let a = FaultWorker::start(
        WORKER,
        &proxied_url,
        &format!("partition-a-{run}"),
        Some(LEASE),
    )
    .await;

    let ids: Vec<String> = (0..WORKFLOWS).map(|w| format!("wf-{w}")).collect();
    for id in &ids {
        checked_steps(id.clone(), STEPS, log_text.clone(), PAUSE_MS)
            .id(id.clone())
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
    }
    // Partition once A is inside every workflow (its second step began).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while step_entries(&log).iter().filter(|e| e.n == 2).count() < WORKFLOWS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A never reached step 2 of every workflow"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    append_line(&log_text, MARKER);
    proxy.blackhole();

    let b = FaultWorker::start(WORKER, &url, &format!("partition-b-{run}"), Some(LEASE)).await;
    wait_all_completed(&keiro, WORKFLOWS, Duration::from_secs(60)).await;
    // Heal: A's held requests reach the database now. Give them time to land
    // (a lease renewal period and then some).
    let before_heal = journal_results(&keiro).await.unwrap();
    proxy.resume();
    tokio::time::sleep(LEASE).await;

    let (a_pid, b_pid) = (a.pid(), b.pid());
    let lines = keiro_tests::process::lines_of(&log);
    let partition_line = lines.iter().position(|l| l == MARKER).unwrap();
    let entries = step_entries(&log);
    let a_began_before: std::collections::HashSet<(String, u32)> = entries
        .iter()
        .filter(|e| e.pid == a_pid && e.line < partition_line)
        .map(|e| (e.id.clone(), e.n))
        .collect();
    let results = journal_results(&keiro).await.unwrap();
    assert_eq!(
        results.len(),
        WORKFLOWS * STEPS as usize,
        "one journal row per step"
    );
    assert_eq!(
        before_heal.len(),
        results.len(),
        "journal rows added after B finished"
    );
    for (was, now) in before_heal.iter().zip(&results) {
        assert_eq!(
            was, now,
            "a journaled step changed once A's held writes arrived"
        );
    }
    let mut per_workflow: HashMap<String, Vec<String>> = HashMap::new();
    for (id, _, result) in &results {
        per_workflow
            .entry(id.clone())
            .or_default()
            .push(serde_json::from_str(result).unwrap());
    }
    let mut taken_over = 0;
    for id in &ids {
        let journaled = &per_workflow[id];
        for (i, pid) in journaled.iter().enumerate() {
            let n = i as u32 + 1;
            assert!(
                *pid == b_pid || (*pid == a_pid && a_began_before.contains(&(id.clone(), n))),
                "workflow {id} step {n}: journaled result from process {pid} (A = {a_pid}, \
                 B = {b_pid}) that A began only after the partition: A journaled over B; \
                 journal {journaled:?}"
            );
        }
        if let Some(first_b) = journaled.iter().position(|pid| *pid == b_pid) {
            taken_over += 1;
            assert!(
                journaled[first_b..].iter().all(|pid| *pid == b_pid),
                "workflow {id}: an A result after B took over: {journaled:?}"
            );
        }
        let out: Vec<String> = keiro.handle(id).await.unwrap().result().await.unwrap();
        assert_eq!(
            &out, journaled,
            "workflow {id}: output differs from its journal"
        );
    }
    assert!(taken_over > 0, "B took over no workflow");
    let reruns = assert_no_journaled_step_ran_again(&log, &ids, STEPS);
    let a_after = entries
        .iter()
        .filter(|e| e.pid == a_pid && e.line > partition_line)
        .count();
    eprintln!(
        "workflows B took over: {taken_over}; step bodies run more than once: {reruns}; \
         bodies A began after the partition: {a_after}"
    );
    a.kill().await;
    b.kill().await;
}
