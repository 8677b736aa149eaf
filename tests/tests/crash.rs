//! Crash recovery with real processes: a child runs a five-step workflow and is
//! SIGKILLed right after step k is journaled (k = 1..=5), or racing its final
//! completion write; a fresh process under the same executor identity resumes
//! it. Steps before k never run again; step k+1 runs at most twice. Killed
//! before its first step (k = 0), the awaited call was never recorded: it
//! leaves nothing, as if it had never started.

use std::process::Stdio;
use std::time::Duration;

use keiro_tests::process::CrashChild;
use keiro_tests::workflows::CRASH_AT_ENV;
use keiro_tests::{on_every_backend, Backend, TestDb};

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

/// Restarts under `executor` with the resume worker and returns the output
/// and the recovery time (process start to completed) in microseconds.
async fn resume(db: &TestDb, executor: &str, id: &str) -> (u32, u64) {
    let (out, micros) = CrashChild::start(CHILD, db, executor, &["resume", id], None)
        .done()
        .await;
    let out = serde_json::from_value(out).expect("a number");
    (out, micros.expect("the recovery time"))
}

async fn killed_after_each_step_resumes_without_rerunning(backend: Backend) {
    for k in 0..=5u32 {
        let db = TestDb::new(backend).await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("effects.log");
        let id = format!("crash-{k}");
        let executor = format!("crash-test-{}", uuid::Uuid::new_v4().simple());

        let point = k.to_string();
        let args = ["run", &id, file.to_str().unwrap()];
        let mut first = CrashChild::start(CHILD, &db, &executor, &args, Some(&point));
        first.line_starting("CRASH_POINT").await;
        first.kill().await; // SIGKILL
        let before = step_counts(&file);
        for (n, &ran) in before.iter().enumerate().skip(1) {
            let expected = usize::from(n as u32 <= k);
            assert_eq!(ran, expected, "k={k}: step {n} before restart");
        }
        if k == 0 {
            let keiro = db.keiro().await;
            let row = keiro::unstable::raw_store(&keiro)
                .get_instance(&id)
                .await
                .unwrap();
            assert!(row.is_none(), "killed before its first step: {row:?}");
            keiro.shutdown().await.unwrap();
            continue;
        }

        let (out, micros) = resume(&db, &executor, &id).await;
        assert_eq!(out, 15, "k={k}");
        let after = step_counts(&file);
        for (n, &ran) in after.iter().enumerate().skip(1) {
            let n32 = n as u32;
            if n32 <= k {
                assert_eq!(ran, 1, "k={k}: journaled step {n} ran again");
            } else if n32 == k + 1 {
                assert!((1..=2).contains(&ran), "k={k}: step {n} ran {ran} times");
            } else {
                assert_eq!(ran, 1, "k={k}: step {n}");
            }
        }
        eprintln!(
            "{{\"backend\":\"{backend:?}\",\"workload\":\"crash_after_step_{k}\",\"recovery_us\":{micros}}}"
        );
    }
}

async fn killed_racing_the_completion_write_converges(backend: Backend) {
    for attempt in 0..3 {
        let db = TestDb::new(backend).await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("effects.log");
        let id = format!("race-{attempt}");
        let executor = format!("crash-test-{}", uuid::Uuid::new_v4().simple());
        let args = ["run", &id, file.to_str().unwrap()];
        let first = CrashChild::start(CHILD, &db, &executor, &args, None);
        // Kill as soon as the last step's side effect shows: around its
        // journal write and the completion write.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while step_counts(&file)[5] == 0 {
            assert!(tokio::time::Instant::now() < deadline, "step 5 never ran");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        first.kill().await;

        let (out, _) = resume(&db, &executor, &id).await;
        assert_eq!(out, 15);
        let after = step_counts(&file);
        assert_eq!(&after[1..5], &[1, 1, 1, 1]);
        assert!((1..=2).contains(&after[5]), "step 5 ran {} times", after[5]);
    }
}

async fn a_second_live_process_with_the_same_identity_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let executor = format!("crash-test-{}", uuid::Uuid::new_v4().simple());
    let args = ["run", "held", file.to_str().unwrap()];
    let mut holder = CrashChild::start(CHILD, &db, &executor, &args, Some("2"));
    holder.line_starting("CRASH_POINT").await;
    let second = tokio::process::Command::new(CHILD)
        .args(["resume", "held"])
        .env("KEIRO_DATABASE_URL", &db.url)
        .env("KEIRO_EXECUTOR_ID", &executor)
        .env_remove(CRASH_AT_ENV)
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&executor) && stderr.contains("in use"),
        "{stderr}"
    );
    holder.kill().await;
    // Once the holder is dead, the same identity takes over at once.
    let (out, _) = resume(&db, &executor, "held").await;
    assert_eq!(out, 15);
}

on_every_backend!(
    killed_after_each_step_resumes_without_rerunning,
    killed_racing_the_completion_write_converges,
    a_second_live_process_with_the_same_identity_is_refused,
);
