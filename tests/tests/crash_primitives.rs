//! SIGKILL at the boundaries of awakeables, child workflows and cancellation,
//! then a restart that converges to the one correct outcome, on both backends.

use keiro_tests::process::{lines_of, CrashChild};
use keiro_tests::{on_every_backend, Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_crash_workflow");

fn executor() -> String {
    format!("prim-{}", uuid::Uuid::new_v4().simple())
}

fn count(lines: &[String], what: &str) -> usize {
    lines.iter().filter(|l| *l == what).count()
}

/// Kills the approval flow at `point`, answers it (while the process is dead
/// when `answer_while_dead`), restarts, and checks the outcome.
async fn approval_killed_at(backend: Backend, point: &str, answer_while_dead: bool) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let file = file.to_str().unwrap();
    let me = executor();
    let id = format!("approval-{point}");
    let mut first = CrashChild::start(BIN, &db, &me, &["approval", &id, file], Some(point));
    let awakeable = if point == "aw-created" {
        None
    } else {
        Some(first.line_starting("AWAKEABLE").await[10..].to_owned())
    };
    first.line_starting("CRASH_POINT").await;
    first.kill().await;
    let answerer = db.keiro().await;
    if answer_while_dead {
        let handed = awakeable.as_ref().expect("announced before the kill");
        answerer
            .resolve_awakeable(handed, "yes".to_string())
            .await
            .unwrap();
    }
    let mut restarted = CrashChild::start(BIN, &db, &me, &["resume", &id], None);
    // The id (its secret included) is journaled: the restarted run hands out
    // the same one.
    let expected_id = restarted.line_starting("AWAKEABLE").await[10..].to_owned();
    assert!(
        expected_id.starts_with(&format!("{id}/0/0/")),
        "{expected_id}"
    );
    if let Some(handed) = &awakeable {
        assert_eq!(handed, &expected_id);
    }
    if !answer_while_dead {
        // Answer once the restarted run waits again.
        for _ in 0..200 {
            match answerer
                .resolve_awakeable(&expected_id, "yes".to_string())
                .await
            {
                Ok(()) => break,
                Err(keiro::Error::AlreadyResolved { .. }) => break,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(25)).await,
            }
        }
    }
    let (out, _) = restarted.done().await;
    assert_eq!(out, serde_json::json!("yes"), "{point}");
    let effects = lines_of(std::path::Path::new(file));
    assert_eq!(count(&effects, "notify"), 1, "{point}: {effects:?}");
    assert_eq!(count(&effects, "finish"), 1, "{point}: {effects:?}");
    // A second answer is refused: the first one stands.
    let again = answerer
        .resolve_awakeable(&expected_id, "no".to_string())
        .await;
    assert!(matches!(again, Err(keiro::Error::AlreadyResolved { .. })));
}

async fn approval_killed_after_creating_the_awakeable(backend: Backend) {
    approval_killed_at(backend, "aw-created", false).await;
}

async fn approval_killed_while_waiting_and_answered_while_dead(backend: Backend) {
    approval_killed_at(backend, "aw-waiting", true).await;
}

async fn approval_killed_while_waiting_and_answered_after_restart(backend: Backend) {
    approval_killed_at(backend, "aw-waiting", false).await;
}

async fn approval_killed_after_consuming_the_answer(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let file = file.to_str().unwrap();
    let me = executor();
    let mut first = CrashChild::start(
        BIN,
        &db,
        &me,
        &["approval", "ap", file],
        Some("aw-consumed"),
    );
    let id = first.line_starting("AWAKEABLE").await[10..].to_owned();
    db.keiro()
        .await
        .resolve_awakeable(&id, "yes".to_string())
        .await
        .unwrap();
    first.line_starting("CRASH_POINT").await;
    first.kill().await;
    let (out, _) = CrashChild::start(BIN, &db, &me, &["resume", "ap"], None)
        .done()
        .await;
    assert_eq!(out, serde_json::json!("yes"));
    let effects = lines_of(std::path::Path::new(file));
    assert_eq!(
        (count(&effects, "notify"), count(&effects, "finish")),
        (1, 1),
        "{effects:?}"
    );
}

/// Kills the family at `point` and restarts it.
async fn family_killed_at(backend: Backend, point: &str) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let file = file.to_str().unwrap();
    let me = executor();
    let id = format!("family-{point}");
    let mut first = CrashChild::start(BIN, &db, &me, &["family", &id, file], Some(point));
    first.line_starting("CRASH_POINT").await;
    first.kill().await;
    let (out, _) = CrashChild::start(BIN, &db, &me, &["resume", &id], None)
        .done()
        .await;
    assert_eq!(out, serde_json::json!(8), "{point}");
    let effects = lines_of(std::path::Path::new(file));
    assert_eq!(count(&effects, "kid"), 1, "{point}: {effects:?}");
    assert_eq!(count(&effects, "parent"), 1, "{point}: {effects:?}");
    let child = db
        .keiro()
        .await
        .store()
        .get_instance(&format!("{id}/0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(child.status.as_str(), "completed");
}

async fn family_killed_while_the_child_runs(backend: Backend) {
    family_killed_at(backend, "kid-running").await;
}

async fn family_killed_after_starting_the_child(backend: Backend) {
    family_killed_at(backend, "child-started").await;
}

async fn family_killed_after_the_child_woke_the_parent(backend: Backend) {
    family_killed_at(backend, "child-consumed").await;
}

async fn a_cancellation_holds_across_a_crash(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let file = file.to_str().unwrap();
    let me = executor();
    let mut first = CrashChild::start(BIN, &db, &me, &["family", "fam", file], Some("kid-running"));
    first.line_starting("CRASH_POINT").await;
    // Cancel the parent (cascading to the running child), then kill the
    // process that runs both.
    let canceller = db.keiro().await;
    let keiro::CancelOutcome::Cancelled { ids } = canceller.cancel("fam").await.unwrap() else {
        panic!("expected a cancellation");
    };
    assert_eq!(ids, ["fam", "fam/0"]);
    first.kill().await;
    let restarted = canceller
        .store()
        .get_instance("fam")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(restarted.status.as_str(), "cancelled");
    // A worker restarted under the same identity finds nothing to run.
    let worker = keiro::Keiro::builder(&db.url)
        .executor_id(&me)
        .connect()
        .await
        .unwrap();
    let options = keiro::ResumeOptions::default().log(|_| {});
    let summary = worker.resume_once(&options).await.unwrap();
    assert_eq!(summary.discovered, 0);
    assert!(
        lines_of(std::path::Path::new(file)).is_empty(),
        "a cancelled step ran"
    );
    for id in ["fam", "fam/0"] {
        let row = worker.store().get_instance(id).await.unwrap().unwrap();
        assert_eq!(row.status.as_str(), "cancelled", "{id}");
    }
}

on_every_backend!(
    approval_killed_after_creating_the_awakeable,
    approval_killed_while_waiting_and_answered_while_dead,
    approval_killed_while_waiting_and_answered_after_restart,
    approval_killed_after_consuming_the_answer,
    family_killed_while_the_child_runs,
    family_killed_after_starting_the_child,
    family_killed_after_the_child_woke_the_parent,
    a_cancellation_holds_across_a_crash,
);
