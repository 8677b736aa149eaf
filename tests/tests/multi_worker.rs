//! Many workers on PostgreSQL: three worker processes drain 300 enqueued
//! workflows, and two do through pgbouncer in transaction pooling mode
//! (where they find work by polling: `LISTEN` cannot pass the proxy). Each
//! completes exactly once, no step is journaled twice, no step body runs
//! twice, and every worker takes a share.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use keiro_tests::workflows::three_marks;
use keiro_tests::{Backend, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");
const WORKFLOWS: u32 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_share_300_workflows_exactly_once() {
    share_exactly_once(Backend::Postgres, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_through_pgbouncer_share_300_workflows_exactly_once() {
    share_exactly_once(Backend::PgBouncer, 2).await;
}

/// `processes` worker processes on `backend` drain [`WORKFLOWS`] enqueued
/// workflows.
async fn share_exactly_once(backend: Backend, processes: usize) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log");
    let file = file.to_str().unwrap().to_owned();

    let mut workers = Vec::new();
    for n in 0..processes {
        let mut worker = Command::new(CHILD)
            .arg("worker")
            .env("KEIRO_DATABASE_URL", &db.url)
            .env(
                "KEIRO_EXECUTOR_ID",
                format!("worker-{n}-{}", uuid::Uuid::new_v4().simple()),
            )
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = worker.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
        assert_eq!(ready.unwrap().unwrap().as_deref(), Some("READY"));
        workers.push(worker);
    }

    // Only enqueue here: this process runs nothing.
    let keiro = db.keiro().await;
    let mut handles = Vec::new();
    for w in 0..WORKFLOWS {
        let handle = three_marks(file.clone(), w)
            .id(format!("wf-{w}"))
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
        handles.push((w, handle));
    }
    for (w, handle) in &handles {
        let out = tokio::time::timeout(Duration::from_secs(120), handle.result()).await;
        assert_eq!(out.expect("workflow finished in time").unwrap(), w * 10 + 3);
    }
    for worker in &mut workers {
        worker.start_kill().unwrap();
        worker.wait().await.unwrap();
    }

    // No step body ran twice; every step ran.
    let text = std::fs::read_to_string(&file).unwrap();
    let mut seen = HashSet::new();
    let mut per_process: HashMap<String, usize> = HashMap::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (wf, step, pid) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        assert!(
            seen.insert((wf.to_owned(), step.to_owned())),
            "step {step} of workflow {wf} ran twice"
        );
        *per_process.entry(pid.to_owned()).or_default() += 1;
    }
    assert_eq!(seen.len(), (WORKFLOWS * 3) as usize);
    assert_eq!(
        per_process.len(),
        processes,
        "work was not spread over the {processes} workers: {per_process:?}"
    );

    // Exactly one journal row per step, and every instance completed once.
    let store = keiro.store();
    let pool = store.postgres_pool().expect("a PostgreSQL store");
    // Simple-protocol reads: one exchange each, right through the proxy too.
    let count = |sql: &'static str| async move {
        let row = sqlx::Executor::fetch_one(pool, sql).await.unwrap();
        sqlx::Row::get::<i64, _>(&row, 0)
    };
    let rows = count("SELECT count(*) FROM keiro.steps").await;
    assert_eq!(rows, i64::from(WORKFLOWS * 3));
    let completed = count("SELECT count(*) FROM keiro.workflows WHERE status = 'completed'").await;
    assert_eq!(completed, i64::from(WORKFLOWS));
    eprintln!("steps per worker process: {per_process:?}");
}
