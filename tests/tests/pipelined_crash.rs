//! The pipelined journal across a SIGKILL, on both backends: a child process
//! runs `pipelined_steps` (30 paced steps, event `half` set after step 15)
//! and is killed at several points; the journal it leaves is always a prefix
//! of the run, everything before a barrier that the outside saw is in it,
//! and a restarted process finishes the run without running a journaled
//! step again.

use std::time::Duration;

use keiro_tests::process::CrashChild;
use keiro_tests::{on_every_backend, Backend, TestDb};

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");
/// Steps in the run; event `half` is set after step `STEPS / 2`.
const STEPS: u32 = 30;
/// How long each step's body takes.
const PACE_MS: &str = "3";

/// How many times each step (1..=STEPS) ran, from the side-effect file.
fn runs(file: &std::path::Path) -> Vec<usize> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut counts = vec![0; STEPS as usize + 1];
    for line in text.lines() {
        let n: usize = line.strip_prefix("step ").unwrap().parse().unwrap();
        counts[n] += 1;
    }
    counts
}

/// The journal seq of step `n`: the event takes the seq after step
/// `STEPS / 2`.
fn seq_of(n: u32) -> i64 {
    if n <= STEPS / 2 {
        i64::from(n) - 1
    } else {
        i64::from(n)
    }
}

async fn a_killed_pipelined_run_leaves_a_prefix_and_resumes(backend: Backend) {
    // Killed early, just after the event's barrier could have passed, and
    // late: each time as soon as the side-effect file shows that many steps.
    for kill_after in [4usize, 16, 26] {
        let db = TestDb::new(backend).await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("effects.log");
        let id = format!("pipelined-{kill_after}");
        let executor = format!("crash-test-{}", uuid::Uuid::new_v4().simple());
        let steps = STEPS.to_string();
        let args = ["pipelined", &id, file.to_str().unwrap(), &steps, PACE_MS];
        let first = CrashChild::start(CHILD, &db, &executor, &args, None);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while runs(&file).iter().filter(|&&ran| ran > 0).count() < kill_after {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the run never reached step {kill_after}"
            );
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        first.kill().await; // SIGKILL

        let keiro = db.keiro().await;
        let store = keiro::unstable::raw_store(&keiro);
        let journal = store.load_journal(&id, 0).await.unwrap();
        let seqs: Vec<i64> = journal.iter().map(|row| row.seq).collect();
        // A prefix: no row without every row before it.
        assert_eq!(
            seqs,
            (0..seqs.len() as i64).collect::<Vec<_>>(),
            "killed after {kill_after} steps: the journal is not a prefix"
        );
        let before = runs(&file);
        for n in 1..=STEPS {
            if seqs.contains(&seq_of(n)) {
                assert_eq!(before[n as usize], 1, "step {n} is journaled, so it ran");
            }
        }
        // The event is past a barrier: if the outside sees it, every step
        // before it is journaled.
        let half: Option<u32> = keiro.get_event(&id, "half").await.unwrap();
        if let Some(half) = half {
            assert_eq!(half, STEPS / 2);
            assert!(
                seqs.len() > (STEPS / 2) as usize,
                "killed after {kill_after} steps: event `half` is visible with only {} rows",
                seqs.len()
            );
        }
        let lost = (1..=STEPS)
            .filter(|&n| before[n as usize] > 0 && !seqs.contains(&seq_of(n)))
            .count();
        eprintln!(
            "{{\"backend\":\"{backend:?}\",\"killed_after\":{kill_after},\"journaled\":{},\"ran_not_journaled\":{lost},\"event_visible\":{}}}",
            seqs.len(),
            half.is_some()
        );
        keiro.shutdown().await.unwrap();

        // A fresh process under the same identity finishes the run.
        let (out, _) = CrashChild::start(CHILD, &db, &executor, &["resume", &id], None)
            .done()
            .await;
        let total = out.get("Ok").unwrap_or(&out).as_u64();
        assert_eq!(total, Some(u64::from(STEPS * (STEPS + 1) / 2)), "{out}");
        let after = runs(&file);
        for n in 1..=STEPS {
            let ran = after[n as usize];
            if seqs.contains(&seq_of(n)) {
                assert_eq!(
                    ran, 1,
                    "killed after {kill_after}: journaled step {n} ran again"
                );
            } else {
                // Ran at most once before the kill (its row lost), once after.
                assert!((1..=2).contains(&ran), "step {n} ran {ran} times");
            }
        }
    }
}

on_every_backend!(a_killed_pipelined_run_leaves_a_prefix_and_resumes);
