//! A step whose body ran while PostgreSQL went away (a throwaway cluster on
//! its own port, stopped with `-m immediate`): the run retries the write of
//! its result instead of giving the instance up, so once the server is back
//! the step is journaled and its body does not run again. Likewise the
//! write of a run's end: an awaited call whose workflow returned during an
//! outage gets its result once the server is back, not the outage's error.
//!
//! Its own test binary: the workflow below changes the set of workflows a
//! binary registers, and with it the application version that decides which
//! workers may claim its instances (the fault worker of
//! `fault_pg_restart.rs` must match that file's).

use std::time::Duration;

use std::path::PathBuf;
use std::sync::Arc;

use keiro::{step, workflow, Keiro, ResumeOptions};
use keiro_tests::pg_cluster::{cluster_or_skip, PgCluster};

/// Adds a line to `log`: one per run of the body that calls it.
fn note_run(log: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    std::io::Write::write_all(&mut file, b"ran\n").unwrap();
}

/// Waits until `gate` exists (the test opens it).
async fn pass_gate(gate: &str) {
    while !std::path::Path::new(gate).exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Notes its run in `log`, then waits for `gate` before it returns.
#[step]
async fn gated(log: String, gate: String) -> u32 {
    note_run(&log);
    pass_gate(&gate).await;
    7
}

/// One gated step.
#[workflow]
async fn gated_once(log: String, gate: String) -> u32 {
    gated(log, gate).await + 1
}

/// Notes its run in `log`.
#[step]
async fn noted(log: String) -> u32 {
    note_run(&log);
    41
}

/// Waits for `gate` after its one step, then returns.
#[workflow]
async fn ends_after_gate(log: String, gate: String) -> u32 {
    let n = noted(log).await;
    // Not journaled on purpose: the test holds the run here.
    #[keiro::nondeterministic_ok]
    pass_gate(&gate).await;
    n + 1
}

/// A throwaway cluster, a runtime on it, and a run log and gate file.
struct Scene {
    cluster: Arc<PgCluster>,
    keiro: Keiro,
    _dir: tempfile::TempDir,
    log: PathBuf,
    gate: PathBuf,
}

impl Scene {
    async fn new(test: &str) -> Option<Scene> {
        let cluster = Arc::new(cluster_or_skip(test)?);
        let keiro = Keiro::builder(cluster.keiro_url()).connect().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        Some(Scene {
            cluster,
            keiro,
            log: dir.path().join("runs.log"),
            gate: dir.path().join("gate"),
            _dir: dir,
        })
    }

    /// The workflows' arguments: the log's and the gate's paths.
    fn args(&self) -> (String, String) {
        (
            self.log.display().to_string(),
            self.gate.display().to_string(),
        )
    }

    /// Waits until the step's body has run (noted its run).
    async fn step_ran(&self) {
        let started = std::time::Instant::now();
        while !self.log.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the step never ran"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the server, opens the gate (so the held run goes on to its
    /// next write), and starts the server again 1.5 s later.
    async fn outage_through_the_gate(&self) {
        let stopped = self.cluster.clone();
        tokio::task::spawn_blocking(move || stopped.stop_immediate())
            .await
            .unwrap();
        std::fs::write(&self.gate, b"open").unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let started = self.cluster.clone();
        tokio::task::spawn_blocking(move || started.start())
            .await
            .unwrap();
    }

    /// Asserts the step's body ran once.
    fn assert_ran_once(&self) {
        let runs = std::fs::read_to_string(&self.log).unwrap();
        assert_eq!(
            runs.lines().count(),
            1,
            "the step's body ran again: {runs:?}"
        );
    }
}

/// The server stops while a step's body runs, so the write of its result
/// fails; the run retries the write (a conflict-handled insert) instead of
/// giving the instance up, and once the server is back the workflow ends
/// with the step's body run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_write_meets_an_outage_is_journaled_without_running_again() {
    let test = "a_step_whose_write_meets_an_outage_is_journaled_without_running_again";
    let Some(scene) = Scene::new(test).await else {
        return;
    };
    let worker = scene
        .keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(100)))
        .await
        .unwrap();
    let (log, gate) = scene.args();
    let id = format!("gated-{}", uuid::Uuid::new_v4().simple());
    let handle = gated_once(log, gate)
        .id(&id)
        .on(&scene.keiro)
        .enqueue()
        .await
        .unwrap();
    // The body runs; then the server goes away, and the body returns.
    scene.step_ran().await;
    scene.outage_through_the_gate().await;
    let out = tokio::time::timeout(Duration::from_secs(60), handle.result())
        .await
        .expect("the workflow ends once the server is back")
        .expect("its result");
    assert_eq!(out, 8);
    scene.assert_ran_once();
    worker.shutdown().await;
}

/// The server stops after a workflow's step was journaled and before its
/// end is recorded: the caller awaiting it still gets its result once the
/// server is back (the end's write is retried), and the step ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_written_during_an_outage_reaches_the_awaiting_caller() {
    let test = "an_end_written_during_an_outage_reaches_the_awaiting_caller";
    let Some(scene) = Scene::new(test).await else {
        return;
    };
    let (log, gate) = scene.args();
    let id = format!("ends-{}", uuid::Uuid::new_v4().simple());
    let call = ends_after_gate(log, gate).id(&id).on(&scene.keiro);
    let awaiting = tokio::spawn(async move { call.await });
    // The step is journaled once its body has run and the next statement
    // of the body waits at the gate; give the write a moment.
    scene.step_ran().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    scene.outage_through_the_gate().await;
    let out = tokio::time::timeout(Duration::from_secs(60), awaiting)
        .await
        .expect("the call returns once the server is back")
        .unwrap()
        .expect("the end's write is retried, not returned as an error");
    assert_eq!(out, 42);
    scene.assert_ran_once();
    scene.keiro.shutdown().await.unwrap();
}
