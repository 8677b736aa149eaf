//! Version routing across real processes, on both backends (one SQLite file
//! or one PostgreSQL database): two worker processes of different
//! `KEIRO_APP_VERSION`s each run only their own version's instances; once
//! one is gone, its version's new work waits (counted, never run by the
//! other) until `retarget` moves it, and then the other worker runs it.

use std::time::{Duration, Instant};

use keiro::{Keiro, WorkflowStatus};
use keiro_tests::process::{lines_of, CrashChild};
use keiro_tests::{on_both_backends, Backend, TestDb};

const BINARY: &str = env!("CARGO_BIN_EXE_version_worker");

/// Waits (30 s at most) until every id in `ids` completed.
async fn all_completed(keiro: &Keiro, ids: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in ids {
        loop {
            let status = keiro.summary(id).await.unwrap().status;
            if status == WorkflowStatus::Completed {
                break;
            }
            assert!(Instant::now() < deadline, "{id} is still {status:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The sorted `<version> <id>` lines of the effects file.
fn effects(path: &std::path::Path) -> Vec<String> {
    let mut lines = lines_of(path);
    lines.sort();
    lines
}

async fn two_versions_run_only_their_own_instances_until_retargeted(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("effects");
    let file = path.to_str().unwrap();
    let mut blue = CrashChild::start_with_env(
        BINARY,
        &db,
        &[("KEIRO_APP_VERSION", "blue")],
        &[file, "blue-1", "blue-2"],
    );
    let mut green = CrashChild::start_with_env(
        BINARY,
        &db,
        &[("KEIRO_APP_VERSION", "green")],
        &[file, "green-1", "green-2"],
    );
    assert_eq!(blue.line_starting("READY").await, "READY blue");
    assert_eq!(green.line_starting("READY").await, "READY green");
    let operator = db
        .builder()
        .app_version("operator")
        .connect()
        .await
        .unwrap();
    all_completed(&operator, &["blue-1", "blue-2", "green-1", "green-2"]).await;
    assert_eq!(
        effects(&path),
        [
            "blue blue-1",
            "blue blue-2",
            "green green-1",
            "green green-2"
        ],
        "each worker ran exactly its own version's instances"
    );
    for (id, version) in [("blue-1", "blue"), ("green-2", "green")] {
        let recorded = operator.summary(id).await.unwrap().version;
        assert_eq!(recorded.as_deref(), Some(version), "{id}");
    }

    // Blue is gone: blue work enqueued now waits; green does not take it.
    blue.kill().await;
    let blue_client = db.builder().app_version("blue").connect().await.unwrap();
    let moved_ids = ["blue-3", "blue-4"];
    for id in moved_ids {
        enqueue_routed(&blue_client, id).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    for id in moved_ids {
        let status = operator.summary(id).await.unwrap().status;
        assert_eq!(status, WorkflowStatus::Pending, "green ran blue's {id}");
    }
    let counts = operator.version_counts().await.unwrap();
    let blue = counts
        .iter()
        .find(|c| c.version.as_deref() == Some("blue"))
        .map(|c| (c.unfinished, c.due));
    assert_eq!(blue, Some((2, 2)), "{counts:?}");

    // Retarget: green runs the moved instances.
    assert_eq!(operator.retarget("blue", "green").await.unwrap(), 2);
    all_completed(&operator, &moved_ids).await;
    let lines = effects(&path);
    for id in moved_ids {
        assert!(
            lines.contains(&format!("green {id}")),
            "green ran {id}: {lines:?}"
        );
        assert!(!lines.contains(&format!("blue {id}")), "{lines:?}");
    }
    // The instances blue finished keep their version.
    let recorded = operator.summary("blue-1").await.unwrap().version;
    assert_eq!(recorded.as_deref(), Some("blue"));
    green.kill().await;
}

/// Enqueues `routed(id)` (the worker binary's workflow, by name) under
/// `keiro`'s version, as a client of that version that does not link it.
async fn enqueue_routed(keiro: &Keiro, id: &str) {
    keiro::unstable::raw_store(keiro)
        .create_instance(&keiro_store::NewInstance {
            app_version: Some(keiro.app_version()),
            ..keiro_store::NewInstance::new(id, "routed", &serde_json::to_string(&(id,)).unwrap())
        })
        .await
        .unwrap();
}

on_both_backends!(two_versions_run_only_their_own_instances_until_retargeted);
