//! Retry and fork with real processes: a child SIGKILLed after step 2 of a
//! five-step workflow, its instance cancelled and retried, is run by another
//! process without re-running steps 1 and 2; a fork from step 3 of a
//! completed run is run by another process through steps 3 to 5 only.

use keiro::ForkFrom;
use keiro_tests::process::CrashChild;
use keiro_tests::{on_both_backends, Backend, TestDb};

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

fn step_counts(file: &std::path::Path) -> [usize; 6] {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut counts = [0; 6];
    for line in text.lines() {
        let n: usize = line.strip_prefix("step ").unwrap().parse().unwrap();
        counts[n] += 1;
    }
    counts
}

fn executor() -> String {
    format!("retry-test-{}", uuid::Uuid::new_v4().simple())
}

/// Runs `id` to its end in a fresh process with a resume worker.
async fn resume_elsewhere(db: &TestDb, id: &str) -> u32 {
    let (out, _) = CrashChild::start(CHILD, db, &executor(), &["resume", id], None)
        .done()
        .await;
    serde_json::from_value(out).expect("a number")
}

async fn a_killed_then_cancelled_instance_is_retried_by_another_process(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let args = ["run", "victim", file.to_str().unwrap()];
    let mut first = CrashChild::start(CHILD, &db, &executor(), &args, Some("2"));
    first.line_starting("CRASH_POINT").await;
    first.kill().await; // SIGKILL
    assert_eq!(step_counts(&file), [0, 1, 1, 0, 0, 0]);

    let keiro = db.keiro().await;
    keiro.cancel("victim").await.unwrap();
    keiro.retry("victim").await.unwrap();
    assert_eq!(resume_elsewhere(&db, "victim").await, 15);
    assert_eq!(step_counts(&file), [0, 1, 1, 1, 1, 1]);
}

async fn a_fork_from_step_three_is_run_by_another_process(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let args = ["run", "original", file.to_str().unwrap()];
    let (out, _) = CrashChild::start(CHILD, &db, &executor(), &args, None)
        .done()
        .await;
    assert_eq!(out, 15);
    assert_eq!(step_counts(&file), [0, 1, 1, 1, 1, 1]);

    let keiro = db.keiro().await;
    // Step 3 is journaled at seq 2.
    let forked = keiro.fork("original", ForkFrom::Step(2)).await.unwrap();
    assert_eq!(resume_elsewhere(&db, &forked).await, 15);
    assert_eq!(step_counts(&file), [0, 1, 1, 2, 2, 2]);
}

on_both_backends!(
    a_killed_then_cancelled_instance_is_retried_by_another_process,
    a_fork_from_step_three_is_run_by_another_process,
);
