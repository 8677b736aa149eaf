//! Payload limits on awakeable answers and timer payloads, on both backends:
//! an answer, a rejection reason or a timer payload larger, as JSON, than the
//! limit is refused before anything is written (`Error::PayloadTooLarge`,
//! `TimerError::PayloadTooLarge`); one exactly at the limit passes. Writes
//! in the caller's transaction (`resolve_awakeable_tx`, `schedule_tx`) use
//! the default limit when no process-wide runtime exists.

use std::time::Duration;

use keiro::timers::{TimerError, TimerId, TimerRequest};
use keiro::{workflow, Error, Keiro, WorkflowStatus, DEFAULT_MAX_PAYLOAD_BYTES};
use keiro_tests::timers::{pool, Pool};
use keiro_tests::{on_both_backends, Backend, TestDb};

/// The runtime's limit in these tests.
const LIMIT: usize = 1000;

async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .max_payload_bytes(LIMIT)
        .suspend_after(Duration::from_millis(10))
        .connect()
        .await
        .unwrap()
}

/// Publishes its awakeable's id as event `awakeable`, then waits for a text.
#[workflow]
async fn waits_for_text(_tag: String) -> Result<usize, String> {
    let answer = keiro::awakeable::<String>().await;
    keiro::set_event("awakeable", &answer.id().to_string())
        .await
        .map_err(|e| e.to_string())?;
    answer
        .await
        .map(|text| text.len())
        .map_err(|e| e.to_string())
}

/// Runs `$body` in a transaction on `$keiro`'s database, then commits it.
macro_rules! in_tx {
    ($keiro:expr, |$tx:ident| $body:expr) => {{
        let timers = $keiro.timers();
        match pool(&timers) {
            Pool::Sqlite(s) => {
                let mut $tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
                let out = $body;
                $tx.commit().await.unwrap();
                out
            }
            Pool::Postgres(p) => {
                let mut $tx = p.begin().await.unwrap();
                let out = $body;
                $tx.commit().await.unwrap();
                out
            }
        }
    }};
}

fn assert_too_large(error: &Error, id: &str, what: &str, size: usize, limit: usize) {
    assert!(
        matches!(
            error,
            Error::PayloadTooLarge { id: i, step, size: s, limit: l, .. }
                if i == id && step.contains(what) && *s == size && *l == limit
        ),
        "{error:?}"
    );
}

async fn awakeable_answers_over_the_limit_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = format!("answers-{}", uuid::Uuid::new_v4().simple());
    let handle = waits_for_text(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let awakeable: String = keiro
        .get_event(&key, "awakeable")
        .wait(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the workflow publishes its awakeable id");
    let journaled = keiro.steps(&key).await.unwrap().len();

    // An answer is stored as `{"Ok":…}`: a text of n characters is n + 9
    // bytes.
    let error = keiro
        .resolve_awakeable(&awakeable, "x".repeat(LIMIT - 8))
        .await
        .unwrap_err();
    assert_too_large(&error, &key, "answer to awakeable", LIMIT + 1, LIMIT);
    assert!(error.to_string().contains(&key), "{error}");
    // A rejection is stored as `{"Err":"…"}`: 10 bytes around the reason.
    let error = keiro
        .reject_awakeable(&awakeable, "r".repeat(LIMIT))
        .await
        .unwrap_err();
    assert_too_large(&error, &key, "rejection to awakeable", LIMIT + 10, LIMIT);
    // In the caller's transaction, without a process-wide runtime: the
    // default limit.
    let huge = "h".repeat(DEFAULT_MAX_PAYLOAD_BYTES);
    let error = in_tx!(keiro, |tx| keiro::resolve_awakeable_tx(
        &mut tx, &awakeable, &huge
    )
    .await
    .unwrap_err());
    assert_too_large(
        &error,
        &key,
        "answer to awakeable",
        DEFAULT_MAX_PAYLOAD_BYTES + 9,
        DEFAULT_MAX_PAYLOAD_BYTES,
    );
    // Nothing was written: the workflow still waits, and takes an answer.
    assert_eq!(keiro.steps(&key).await.unwrap().len(), journaled);
    assert_ne!(handle.status().await.unwrap(), WorkflowStatus::Completed);
    let at_limit = "y".repeat(LIMIT - 9);
    keiro.resolve_awakeable(&awakeable, at_limit).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("the answer at the limit resumes the workflow")
        .unwrap();
    assert_eq!(got, Ok(LIMIT - 9));
}

fn assert_timer_too_large(error: &TimerError, id: &str, size: usize, limit: usize) {
    assert!(
        matches!(
            error,
            TimerError::PayloadTooLarge { id: i, process_manager, size: s, limit: l }
                if i == id && process_manager == "saga" && *s == size && *l == limit
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(id) && message.contains("saga"),
        "{message}"
    );
}

fn request(id: &str, text_len: usize) -> TimerRequest {
    TimerRequest::after(id, "saga", "saga-1", Duration::from_secs(3600))
        .payload(serde_json::Value::String("p".repeat(text_len)))
}

async fn timer_payloads_over_the_limit_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let timers = keiro.timers();

    let error = timers
        .schedule(&request("big", LIMIT - 1))
        .await
        .unwrap_err();
    assert_timer_too_large(&error, "big", LIMIT + 1, LIMIT);
    let error = timers
        .schedule_once(&request("big", LIMIT - 1))
        .await
        .unwrap_err();
    assert_timer_too_large(&error, "big", LIMIT + 1, LIMIT);
    let huge = request("huge", DEFAULT_MAX_PAYLOAD_BYTES);
    let error = in_tx!(keiro, |tx| keiro::timers::schedule_tx(&mut tx, &huge)
        .await
        .unwrap_err());
    assert_timer_too_large(
        &error,
        "huge",
        DEFAULT_MAX_PAYLOAD_BYTES + 2,
        DEFAULT_MAX_PAYLOAD_BYTES,
    );
    for id in ["big", "huge"] {
        assert!(timers.get(&TimerId::from(id)).await.unwrap().is_none());
    }

    // Exactly at the limit passes.
    timers.schedule(&request("fits", LIMIT - 2)).await.unwrap();
    let stored = timers.get(&TimerId::from("fits")).await.unwrap().unwrap();
    assert_eq!(stored.payload.as_str().map(str::len), Some(LIMIT - 2));
}

on_both_backends!(
    awakeable_answers_over_the_limit_are_refused,
    timer_payloads_over_the_limit_are_refused,
);
