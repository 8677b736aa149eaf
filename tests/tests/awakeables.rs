//! Awakeables on both backends: the id is durable before it is handed out;
//! answers come from any runtime; the first answer wins; bad answers are
//! refused with distinct errors; a long wait suspends and is woken by the
//! answer.

use std::sync::Mutex;
use std::time::Duration;

use keiro::{step, workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

/// Awakeable ids handed out by `approval`, per test key.
static HANDED_OUT: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn handed_out(key: &str) -> Option<String> {
    HANDED_OUT
        .lock()
        .unwrap()
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, id)| id.clone())
}

#[step]
async fn send_request(key: String, awakeable_id: String) -> bool {
    ran(&key, "send_request");
    HANDED_OUT.lock().unwrap().push((key, awakeable_id));
    true
}

#[workflow]
async fn approval(key: String) -> Result<String, String> {
    let answer = keiro::awakeable::<bool>().await;
    send_request(key.clone(), answer.id().to_string()).await;
    match answer.await {
        Ok(true) => Ok("approved".into()),
        Ok(false) => Ok("declined".into()),
        Err(e) => Err(e.to_string()),
    }
}

async fn runtime(db: &TestDb, suspend_after: Duration) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(format!("aw-{}", uuid::Uuid::new_v4().simple()))
        .suspend_after(suspend_after)
        .connect()
        .await
        .unwrap()
}

async fn wait_for_id(key: &str) -> String {
    for _ in 0..400 {
        if let Some(id) = handed_out(key) {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the workflow never handed out its awakeable");
}

async fn an_answer_from_another_runtime_completes_the_workflow(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = approval(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    assert!(id.starts_with(&key), "{id}");
    // Answered from a runtime that runs nothing (another "process").
    let answerer = db.keiro().await;
    answerer.resolve_awakeable(&id, true).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok("approved".to_string()));
    // The first answer stands; a second is refused and changes nothing.
    let err = answerer.resolve_awakeable(&id, false).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyResolved { .. }), "{err}");
    let err = answerer
        .reject_awakeable(&id, "too late")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyResolved { .. }), "{err}");
    assert_eq!(count(&key, "send_request"), 1);
}

async fn a_rejection_reaches_the_workflow_as_an_error(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = approval(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    keiro
        .reject_awakeable(&id, "budget exhausted")
        .await
        .unwrap();
    let out = handle.result().await.unwrap().unwrap_err();
    assert!(
        out.contains("rejected") && out.contains("budget exhausted"),
        "{out}"
    );
}

async fn bad_answers_are_refused_with_distinct_errors(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = approval(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let id = wait_for_id(&key).await;
    for unknown in ["nonsense", "no-such-workflow/0/0", &format!("{key}/0/1")] {
        let err = keiro.resolve_awakeable(unknown, true).await.unwrap_err();
        assert!(
            matches!(err, Error::UnknownAwakeable { .. }),
            "{unknown}: {err}"
        );
        assert!(err.to_string().contains(unknown));
    }
    let err = keiro.resolve_awakeable(&id, "yes").await.unwrap_err();
    let Error::AwakeableTypeMismatch {
        expected, found, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((expected.as_str(), found.as_str()), ("bool", "&str"));
    // Nothing was recorded by the refused answers: the right one still lands.
    keiro.resolve_awakeable(&id, false).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok("declined".to_string()));
}

async fn a_long_wait_suspends_and_the_answer_wakes_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let starter = runtime(&db, Duration::from_millis(100)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = approval(key.clone())
        .id(&key)
        .on(&starter)
        .enqueue()
        .await
        .unwrap();
    let quiet = ResumeOptions::default().log(|_| {});
    let summary = starter.resume_once(&quiet).await.unwrap();
    assert_eq!((summary.resumed, summary.still_suspended), (1, 1));
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    let row = starter.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.wake_at, row.lease_owner),
        (None, None),
        "suspended on an answer, not a time"
    );
    assert_eq!(starter.resume_once(&quiet).await.unwrap().discovered, 0);
    let id = wait_for_id(&key).await;
    let answerer = db.keiro().await;
    answerer.resolve_awakeable(&id, true).await.unwrap();
    // The answer made it due: the next pass finishes it, replaying the request.
    let summary = starter.resume_once(&quiet).await.unwrap();
    assert_eq!((summary.discovered, summary.completed), (1, 1));
    assert_eq!(handle.result().await.unwrap(), Ok("approved".to_string()));
    assert_eq!(count(&key, "send_request"), 1);
}

/// The longest workflow id keiro accepts ([`keiro::MAX_ID_BYTES`]): far past
/// the 200 bytes a wake notification carries as they are, so it travels as a
/// digest. (Ids of 8,000 bytes and more, which once overflowed PostgreSQL's
/// `NOTIFY` payload, are now refused as `Error::InvalidId`.)
fn long_id(key: &str) -> String {
    format!("{key}-{}", "x".repeat(keiro::MAX_ID_BYTES - key.len() - 1))
}

async fn a_longest_workflow_id_is_answered_and_woken_promptly(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Waiting in memory: the answer from another runtime wakes the waiter.
    let keiro = runtime(&db, Duration::from_secs(30)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let id = long_id(&key);
    assert_eq!(id.len(), keiro::MAX_ID_BYTES);
    let handle = approval(key.clone())
        .id(&id)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let awakeable = wait_for_id(&key).await;
    let answerer = db.keiro().await;
    answerer.resolve_awakeable(&awakeable, true).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), handle.result())
        .await
        .expect("woken within 5 s");
    assert_eq!(out.unwrap(), Ok("approved".to_string()));

    // Suspended: the answer from another runtime wakes a resume worker that
    // would otherwise sleep a minute (PostgreSQL `NOTIFY`; SQLite has no
    // wake across runtimes, so there the worker polls quickly).
    let key = uuid::Uuid::new_v4().to_string();
    let id = long_id(&key);
    let starter = runtime(&db, Duration::from_millis(100)).await;
    let handle = approval(key.clone())
        .id(&id)
        .on(&starter)
        .enqueue()
        .await
        .unwrap();
    let poll = match backend {
        Backend::Postgres | Backend::PgBouncer => Duration::from_secs(60),
        Backend::Sqlite => Duration::from_millis(100),
    };
    let worker = starter
        .resume_worker(ResumeOptions::default().poll_interval(poll).log(|_| {}))
        .await
        .unwrap();
    let awakeable = wait_for_id(&key).await;
    for _ in 0..500 {
        if handle.status().await.unwrap() == WorkflowStatus::Suspended {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    answerer.resolve_awakeable(&awakeable, false).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), handle.result())
        .await
        .expect("woken within 5 s");
    assert_eq!(out.unwrap(), Ok("declined".to_string()));
    worker.shutdown().await;
}

on_both_backends!(
    a_longest_workflow_id_is_answered_and_woken_promptly,
    an_answer_from_another_runtime_completes_the_workflow,
    a_rejection_reaches_the_workflow_as_an_error,
    bad_answers_are_refused_with_distinct_errors,
    a_long_wait_suspends_and_the_answer_wakes_it,
);

#[tokio::test]
async fn outside_a_workflow_an_awakeable_cannot_be_awaited() {
    let awakeable = keiro::awakeable::<u32>().await;
    let err = awakeable.await.unwrap_err();
    assert!(err.to_string().contains("inside a #[workflow]"), "{err}");
}
