//! Retrying a child, on both backends: while its parent still waits for it,
//! the retried child's new result reaches the parent as a first result would
//! (the parent wakes and completes with it); once the parent recorded the
//! child's result, `keiro.retry(child)` is refused naming the parent.
//!
//! A child's end is recorded in its parent's journal in the transaction that
//! ends it, so a parent that "still waits" on an ended child is made here by
//! deleting that entry (as a database from before that rule would hold it).

use std::time::Duration;

use keiro::{workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::{on_both_backends, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

/// Waits for a number on topic `go`.
#[workflow]
async fn gated_child(_key: String) -> u32 {
    keiro::recv::<u32>("go").await.unwrap_or(0)
}

/// Seq 0: the child, awaited.
#[workflow]
async fn waiting_parent(key: String) -> Result<u32, String> {
    let child = keiro::spawn(gated_child(key.clone()).id(format!("{key}-child")))
        .await
        .map_err(|e| e.to_string())?;
    child.await.map_err(|e| e.to_string())
}

/// A waiting run suspends after 10 ms.
async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .suspend_after(Duration::from_millis(10))
        .connect()
        .await
        .unwrap()
}

async fn status(keiro: &Keiro, id: &str) -> Option<WorkflowStatus> {
    match keiro.handle::<serde_json::Value>(id).await {
        Ok(handle) => Some(handle.status().await.unwrap()),
        Err(_) => None,
    }
}

/// Runs passes until `id` has `wanted`.
async fn run_until(keiro: &Keiro, id: &str, wanted: WorkflowStatus) {
    for _ in 0..50 {
        if status(keiro, id).await.as_ref() == Some(&wanted) {
            return;
        }
        keiro.resume_once(&quiet()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{id} never became {wanted:?}: {:?}",
        status(keiro, id).await
    );
}

/// Starts `waiting_parent(key)`, lets parent and child suspend, and cancels
/// the child (which reports to its parent); returns the child's id.
async fn parent_with_a_cancelled_child(keiro: &Keiro, key: &str) -> String {
    waiting_parent(key.to_owned())
        .id(key)
        .on(keiro)
        .enqueue()
        .await
        .unwrap();
    let child = format!("{key}-child");
    run_until(keiro, &child, WorkflowStatus::Suspended).await;
    run_until(keiro, key, WorkflowStatus::Suspended).await;
    keiro.cancel(&child).await.unwrap();
    child
}

/// Deletes the parent's journal entry for its child, as if the child's end
/// had not reached it: the parent waits for the child again.
async fn forget_the_childs_result(db: &TestDb, backend: Backend, parent: &str) {
    let deleted = match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            let done =
                sqlx::query("DELETE FROM keiro_steps WHERE workflow_id = ? AND kind = 'child'")
                    .bind(parent)
                    .execute(&pool)
                    .await
                    .unwrap();
            pool.close().await;
            done.rows_affected()
        }
        Backend::Postgres | Backend::PgBouncer => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            let done =
                sqlx::query("DELETE FROM keiro.steps WHERE workflow_id = $1 AND kind = 'child'")
                    .bind(parent)
                    .execute(&pool)
                    .await
                    .unwrap();
            pool.close().await;
            done.rows_affected()
        }
    };
    assert_eq!(deleted, 1);
}

async fn a_retried_child_reports_to_its_waiting_parent(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = format!("waiting-{}", uuid::Uuid::new_v4().simple());
    let child = parent_with_a_cancelled_child(&keiro, &key).await;
    // Before the parent runs on with the cancellation, its entry is gone: it
    // waits for the child again.
    forget_the_childs_result(&db, backend, &key).await;
    keiro.resume_once(&quiet()).await.unwrap();
    run_until(&keiro, &key, WorkflowStatus::Suspended).await;

    keiro.retry(&child).await.unwrap();
    keiro.send(child.as_str(), "go", &42u32).await.unwrap();
    run_until(&keiro, &key, WorkflowStatus::Completed).await;
    let parent = keiro.handle::<Result<u32, String>>(&key).await.unwrap();
    assert_eq!(parent.result().await.unwrap(), Ok(42));
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(
        (steps[0].kind.as_str(), &steps[0].value),
        ("child", &serde_json::json!(42))
    );
}

async fn retry_of_a_child_its_parent_recorded_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = format!("recorded-{}", uuid::Uuid::new_v4().simple());
    let child = parent_with_a_cancelled_child(&keiro, &key).await;
    // The parent ran on with the cancellation and returned it as its `Err`.
    run_until(&keiro, &key, WorkflowStatus::Failed).await;

    let error = keiro.retry(&child).await.unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(&error, Error::NotRetryable { id, .. } if *id == child),
        "{error:?}"
    );
    assert!(
        message.contains(&format!(
            "its parent `waiting_parent` (id {key}) already recorded this child's result"
        )),
        "{message}"
    );
    assert!(message.contains("retry or fork the parent"), "{message}");
    // Nothing changed.
    assert_eq!(
        status(&keiro, &child).await,
        Some(WorkflowStatus::Cancelled)
    );
}

on_both_backends!(
    a_retried_child_reports_to_its_waiting_parent,
    retry_of_a_child_its_parent_recorded_is_refused,
);
