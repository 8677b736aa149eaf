//! Messages to running workflows, on both backends: order and exactly-once
//! delivery under concurrent senders, waking a suspended receiver, deadlines,
//! refusals, idempotency keys, and sends from a workflow that happen once
//! however often it replays.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keiro::{step, workflow, Error, ResumeOptions, WorkflowStatus};
use keiro_tests::{on_both_backends, Backend, TestDb};

/// Receives `n` numbers on topic "numbers", in order of arrival.
#[workflow]
async fn collect(n: u32) -> Result<Vec<u64>, String> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(
            keiro::recv::<u64>("numbers")
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(got)
}

/// Waits up to `ms` for a note.
#[workflow]
async fn maybe_note(ms: u64) -> Result<Option<String>, String> {
    keiro::recv::<String>("note")
        .timeout(Duration::from_millis(ms))
        .await
        .map_err(|e| e.to_string())
}

/// Receives one `u64`, reporting a refusal as the workflow's error.
#[workflow]
async fn one_number(_tag: String) -> Result<u64, String> {
    keiro::recv::<u64>("n").await.map_err(|e| e.to_string())
}

/// Which keys' steps have crashed already, and how many runs there were.
static CRASHED: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);

/// Panics (a crash) the first time it runs for `key`.
#[step]
async fn crash_once(key: String) -> u32 {
    let runs = {
        let mut crashed = CRASHED.lock().unwrap();
        let runs = crashed
            .get_or_insert_with(HashMap::new)
            .entry(key.clone())
            .or_default();
        *runs += 1;
        *runs
    };
    if runs == 1 {
        panic!("crash after the send of {key}");
    }
    1
}

fn crash_runs(key: &str) -> u32 {
    CRASHED
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(key).copied())
        .unwrap_or(0)
}

/// Sends one number to `to`, then crashes once: the replay must not send again.
#[workflow]
async fn send_then_crash(to: String) -> Result<u32, String> {
    keiro::send(&to, "numbers", &7u64)
        .await
        .map_err(|e| e.to_string())?;
    Ok(crash_once(to).await)
}

/// Sends to an id nobody has: the refusal is the workflow's result.
#[workflow]
async fn send_to_nobody(to: String) -> Result<String, String> {
    match keiro::send(&to, "numbers", &1u64).await {
        Err(Error::NotFound { id }) => Ok(format!("not found: {id}")),
        other => Err(format!("expected NotFound, got {other:?}")),
    }
}

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

async fn messages_arrive_in_order_each_exactly_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = format!("collect-{}", uuid::Uuid::new_v4().simple());
    let handle = collect(100).id(&id).on(&keiro).start().await.unwrap();
    let senders: Vec<_> = (0..4u64)
        .map(|sender| {
            let keiro = keiro.clone();
            let id = id.clone();
            tokio::spawn(async move {
                for n in 0..25u64 {
                    keiro
                        .send(&id, "numbers", &(sender * 1000 + n))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(60), handle.result())
        .await
        .expect("all 100 messages received")
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 100);
    for sender in 0..4u64 {
        let mine: Vec<u64> = got
            .iter()
            .filter(|v| **v / 1000 == sender)
            .map(|v| v % 1000)
            .collect();
        assert_eq!(mine, (0..25).collect::<Vec<_>>(), "sender {sender}'s order");
    }
}

async fn a_message_wakes_a_suspended_receiver_promptly(backend: Backend) {
    let db = TestDb::new(backend).await;
    let worker_side = db
        .builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let worker = worker_side
        .resume_worker(quiet().poll_interval(Duration::from_secs(30)))
        .await
        .unwrap();
    let id = format!("sleeper-{}", uuid::Uuid::new_v4().simple());
    let handle = collect(1).id(&id).on(&worker_side).enqueue().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.status().await.unwrap() != WorkflowStatus::Suspended {
        assert!(Instant::now() < deadline, "the receiver never suspended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // On PostgreSQL the sender is another runtime (another process, woken by
    // NOTIFY); on SQLite workers share the process with their senders.
    let sender = match backend {
        Backend::Postgres | Backend::PgBouncer => db.keiro().await,
        Backend::Sqlite => worker_side.clone(),
    };
    let sent = Instant::now();
    sender.send(&id, "numbers", &42u64).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("the receiver finished")
        .unwrap();
    assert_eq!(got, Ok(vec![42]));
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "woken only by the 30 s poll: {:?}",
        sent.elapsed()
    );
    worker.shutdown().await;
}

async fn a_receive_with_timeout_yields_none_after_its_deadline(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let started = Instant::now();
    let out = maybe_note(300)
        .id(format!("late-{}", uuid::Uuid::new_v4().simple()))
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(None));
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A message before the deadline is taken.
    let id = format!("early-{}", uuid::Uuid::new_v4().simple());
    let handle = maybe_note(20_000).id(&id).on(&keiro).start().await.unwrap();
    keiro.send(&id, "note", "hello").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, Ok(Some("hello".to_owned())));
}

async fn sends_to_missing_or_ended_instances_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let err = keiro
        .send("no-such-id", "numbers", &1u64)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotFound { id } if id == "no-such-id"),
        "{err}"
    );
    let id = format!("done-{}", uuid::Uuid::new_v4().simple());
    maybe_note(1).id(&id).on(&keiro).await.unwrap().unwrap();
    let err = keiro.send(&id, "note", "too late").await.unwrap_err();
    assert!(
        matches!(&err, Error::NotReceiving { status, .. } if status == "completed"),
        "{err}"
    );
    assert!(err.to_string().contains(&id), "{err}");
}

async fn an_idempotency_key_makes_a_retried_send_a_no_op(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = format!("once-{}", uuid::Uuid::new_v4().simple());
    let handle = collect(2).id(&id).on(&keiro).start().await.unwrap();
    for _ in 0..3 {
        keiro
            .send(&id, "numbers", &1u64)
            .idempotency_key("payment-1")
            .await
            .unwrap();
    }
    keiro.send(&id, "numbers", &2u64).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, Ok(vec![1, 2]), "the retried sends were no-ops");
}

async fn a_message_of_the_wrong_type_is_refused_and_kept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = format!("typed-{}", uuid::Uuid::new_v4().simple());
    let handle = one_number("x".into())
        .id(&id)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    keiro.send(&id, "n", "not a number").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .unwrap()
        .unwrap();
    let message = out.expect_err("a string is not a u64");
    for part in ["topic `n`", &id, "u64", "str"] {
        assert!(message.contains(part), "{message} should name {part}");
    }
    // The refused message was not consumed: it is still queued.
    let store = keiro::unstable::raw_store(&keiro);
    assert_eq!(store.count_waiting_messages(&id, "n").await.unwrap(), 1);
}

async fn a_send_from_a_workflow_happens_once_across_a_crash(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.builder().max_attempts(3).connect().await.unwrap();
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let receiver = format!("rx-{}", uuid::Uuid::new_v4().simple());
    let rx = collect(2).id(&receiver).on(&keiro).start().await.unwrap();
    let sender = format!("tx-{}", uuid::Uuid::new_v4().simple());
    let tx = send_then_crash(receiver.clone())
        .id(&sender)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), tx.result())
        .await
        .expect("the sender recovers from its crash")
        .unwrap();
    assert_eq!(out, Ok(1));
    assert_eq!(crash_runs(&receiver), 2, "it crashed once, then replayed");
    // Exactly one 7 arrived: the replay did not send again.
    keiro.send(&receiver, "numbers", &8u64).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), rx.result())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, Ok(vec![7, 8]));
    // A refused send inside a workflow is journaled: its replay refuses the same way.
    let out = send_to_nobody("nobody-here".into())
        .id(format!("lost-{}", uuid::Uuid::new_v4().simple()))
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok("not found: nobody-here".to_owned()));
    worker.shutdown().await;
}

async fn bad_topics_keys_and_values_are_refused_before_anything_is_sent(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = format!("strict-{}", uuid::Uuid::new_v4().simple());
    let handle = collect(1).id(&id).on(&keiro).start().await.unwrap();
    let long = "t".repeat(keiro::MAX_ID_BYTES + 1);
    let err = keiro.send(&id, &long, &1u64).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidId { what, .. } if *what == "message topic"),
        "{err}"
    );
    let err = keiro.send(&id, "numbers\0", &1u64).await.unwrap_err();
    assert!(matches!(err, Error::InvalidId { .. }), "{err}");
    let err = keiro
        .send(&id, "numbers", &1u64)
        .idempotency_key(long.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidId { what, .. } if *what == "idempotency key"),
        "{err}"
    );
    let err = keiro.send(&id, "numbers", &f64::NAN).await.unwrap_err();
    assert!(matches!(err, Error::NotJournalable { .. }), "{err}");
    assert!(err.to_string().contains("topic `numbers`"), "{err}");
    let store = keiro::unstable::raw_store(&keiro);
    assert_eq!(
        store.count_waiting_messages(&id, "numbers").await.unwrap(),
        0
    );
    keiro.send(&id, "numbers", &3u64).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok(vec![3]));
}

on_both_backends!(
    bad_topics_keys_and_values_are_refused_before_anything_is_sent,
    messages_arrive_in_order_each_exactly_once,
    a_message_wakes_a_suspended_receiver_promptly,
    a_receive_with_timeout_yields_none_after_its_deadline,
    sends_to_missing_or_ended_instances_are_refused,
    an_idempotency_key_makes_a_retried_send_a_no_op,
    a_message_of_the_wrong_type_is_refused_and_kept,
    a_send_from_a_workflow_happens_once_across_a_crash,
);
