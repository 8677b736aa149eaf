//! Payload limits: a value larger, as JSON, than the runtime's
//! `max_payload_bytes` (default 1 MiB) is refused before it is written with
//! [`Error::PayloadTooLarge`] naming workflow, id, which value, its size and
//! the limit; nothing is stored.
//!
//! - An input over the limit is refused at start: the id does not exist.
//! - A step returning 2 MiB under the default limit fails the workflow, and
//!   its result is not journaled.
//! - A message or event over a small configured limit is refused; a value
//!   exactly at the limit passes.
//! - A workflow's return value over the limit fails it.
//! - A limit of 0 is refused by the builder.

use keiro::{step, workflow, Error, WorkflowStatus, DEFAULT_MAX_PAYLOAD_BYTES};
use keiro_store::{Store, StoreOptions};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

on_both_backends!(
    an_input_over_the_limit_is_refused_at_start,
    a_step_returning_two_mib_fails_the_workflow,
    a_message_over_the_limit_is_refused,
    an_event_over_the_limit_is_refused,
    a_return_value_over_the_limit_fails_the_workflow,
    a_limit_of_zero_is_refused,
);

/// A small limit for the message and event tests.
const LIMIT: usize = 1000;

#[workflow]
async fn echo_len(data: String) -> usize {
    data.len()
}

#[step]
async fn produce(key: String, n: usize) -> String {
    ran(&key, "produce");
    "x".repeat(n)
}

#[workflow]
async fn big_result(key: String, n: usize) -> usize {
    produce(key, n).await.len()
}

#[workflow]
async fn one_text(_tag: String) -> Result<usize, String> {
    let note = keiro::recv::<String>("note")
        .await
        .map_err(|e| e.to_string())?;
    Ok(note.len())
}

#[workflow]
async fn repeat_text(n: usize) -> String {
    "r".repeat(n)
}

/// Sets event `blob` to a string of `n` bytes; answers the error as text.
#[workflow]
async fn publish_blob(n: usize) -> Result<(), String> {
    keiro::set_event("blob", &"y".repeat(n))
        .await
        .map_err(|e| e.to_string())
}

async fn store_of(db: &TestDb) -> Store {
    Store::connect(&db.url, &StoreOptions::default())
        .await
        .expect("connect a reading store")
}

async fn an_input_over_the_limit_is_refused_at_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .max_payload_bytes(LIMIT)
        .connect()
        .await
        .unwrap();
    let id = format!("big-input-{}", uuid::Uuid::new_v4());

    // The input is the JSON array of the arguments: `["…"]`, 4 bytes around.
    let error = echo_len("i".repeat(LIMIT))
        .id(&id)
        .on(&keiro)
        .start()
        .await
        .unwrap_err();
    let text = error.to_string();
    match &error {
        Error::PayloadTooLarge {
            workflow,
            id: named,
            step,
            size,
            limit,
        } => {
            assert_eq!(workflow, "echo_len");
            assert_eq!(named, &id);
            assert!(step.contains("input"), "{step}");
            assert_eq!(*size, LIMIT + 4);
            assert_eq!(*limit, LIMIT);
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    assert!(
        text.contains("max_payload_bytes"),
        "says what to do: {text}"
    );
    // Nothing was stored.
    let missing = keiro.handle::<usize>(&id).await;
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );
    // Enqueued, the same.
    let error = echo_len("i".repeat(LIMIT))
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::PayloadTooLarge { .. }), "{error}");
    assert!(keiro.handle::<usize>(&id).await.is_err());

    // Exactly at the limit it runs.
    let fits = "i".repeat(LIMIT - 4);
    let ran = echo_len(fits).id(format!("{id}-ok")).on(&keiro).await;
    assert_eq!(ran.unwrap(), LIMIT - 4);
    keiro.shutdown().await.unwrap();
}

async fn a_step_returning_two_mib_fails_the_workflow(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let id = format!("big-result-{key}");
    let two_mib = 2 * 1024 * 1024;

    let error = big_result(key.clone(), two_mib)
        .id(&id)
        .on(&keiro)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "the result of step `produce` (#0) of workflow `big_result` id `{id}` is {} bytes \
             as JSON, over the payload limit of {DEFAULT_MAX_PAYLOAD_BYTES} bytes",
            two_mib + 2
        )),
        "{text}"
    );
    // Failed at once: every attempt would produce the same value.
    assert_eq!(count(&key, "produce"), 1);
    let handle = keiro.handle::<usize>(&id).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Failed);
    let again = handle.result().await.unwrap_err().to_string();
    assert!(again.contains("over the payload limit"), "{again}");

    // The result was not journaled.
    let store = store_of(&db).await;
    let journal = store.load_journal(&id, 0).await.unwrap();
    assert!(
        journal.iter().all(|row| row.name != "produce"),
        "{journal:?}"
    );
    store.close().await;

    // Just under the limit the same step completes.
    let under = DEFAULT_MAX_PAYLOAD_BYTES - 2;
    let done = big_result(key.clone(), under)
        .id(format!("{id}-ok"))
        .on(&keiro)
        .await;
    assert_eq!(done.unwrap(), under);
    keiro.shutdown().await.unwrap();
}

async fn a_message_over_the_limit_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .max_payload_bytes(LIMIT)
        .connect()
        .await
        .unwrap();
    let id = format!("note-{}", uuid::Uuid::new_v4());
    let handle = one_text("t".into())
        .id(&id)
        .on(&keiro)
        .start()
        .await
        .unwrap();

    let error = keiro
        .send(&id, "note", &"m".repeat(LIMIT))
        .await
        .unwrap_err();
    match &error {
        Error::PayloadTooLarge {
            id: named,
            step,
            size,
            limit,
            ..
        } => {
            assert_eq!(named, &id);
            assert!(step.contains("topic `note`"), "{step}");
            assert_eq!((*size, *limit), (LIMIT + 2, LIMIT));
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    // Nothing was stored: the receiver still waits, and takes the next one.
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Running);
    let fits = "m".repeat(LIMIT - 2);
    keiro.send(&id, "note", &fits).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok(LIMIT - 2));
    keiro.shutdown().await.unwrap();
}

async fn an_event_over_the_limit_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .max_payload_bytes(LIMIT)
        .connect()
        .await
        .unwrap();
    let id = format!("blob-{}", uuid::Uuid::new_v4());

    let refused = publish_blob(LIMIT).id(&id).on(&keiro).await.unwrap();
    let text = refused.unwrap_err();
    assert!(
        text.contains(&format!(
            "the value of event `blob` of workflow `publish_blob` id `{id}` is {} bytes as \
             JSON, over the payload limit of {LIMIT} bytes",
            LIMIT + 2
        )),
        "{text}"
    );
    let event = keiro.get_event::<String>(&id, "blob").await.unwrap();
    assert_eq!(event, None, "nothing was stored");

    let ok = format!("{id}-ok");
    publish_blob(LIMIT - 2)
        .id(&ok)
        .on(&keiro)
        .await
        .unwrap()
        .unwrap();
    let event = keiro.get_event::<String>(&ok, "blob").await.unwrap();
    assert_eq!(event, Some("y".repeat(LIMIT - 2)));
    keiro.shutdown().await.unwrap();
}

async fn a_return_value_over_the_limit_fails_the_workflow(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .max_payload_bytes(LIMIT)
        .connect()
        .await
        .unwrap();
    let id = format!("repeat-{}", uuid::Uuid::new_v4());

    let error = repeat_text(LIMIT).id(&id).on(&keiro).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "the return value (output) of workflow `repeat_text` id `{id}` is {} bytes",
            LIMIT + 2
        )),
        "{text}"
    );
    let store = store_of(&db).await;
    let row = store.get_instance(&id).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "failed");
    assert_eq!(row.output, None, "nothing was stored");
    store.close().await;

    let fits = repeat_text(LIMIT - 2)
        .id(format!("{id}-ok"))
        .on(&keiro)
        .await;
    assert_eq!(fits.unwrap().len(), LIMIT - 2);
    keiro.shutdown().await.unwrap();
}

async fn a_limit_of_zero_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let error = db
        .builder()
        .max_payload_bytes(0)
        .connect()
        .await
        .unwrap_err();
    match &error {
        Error::InvalidOption { option, reason } => {
            assert_eq!(*option, "max_payload_bytes");
            assert!(reason.contains("at least 1"), "{reason}");
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
}
