//! Events and streams a workflow publishes, read from outside (another
//! runtime, as another process would) while it runs, on both backends.

use std::time::Duration;

use futures::StreamExt;
use keiro::{workflow, Error};
use keiro_tests::{on_both_backends, Backend, TestDb};

/// Publishes `n` progress events and stream lines, waits for "finish", then
/// writes a last line and ends (which ends the stream for readers).
#[workflow]
async fn publisher(n: u32) -> Result<u32, String> {
    for i in 1..=n {
        keiro::set_event("progress", &i)
            .await
            .map_err(|e| e.to_string())?;
        keiro::write_stream("log", &format!("line {i}"))
            .await
            .map_err(|e| e.to_string())?;
    }
    keiro::recv::<()>("finish")
        .await
        .map_err(|e| e.to_string())?;
    keiro::write_stream("log", "last")
        .await
        .map_err(|e| e.to_string())?;
    Ok(n)
}

/// Writes two values to "a", closes it, writes a third (ignored).
#[workflow]
async fn closer(_tag: String) -> Result<(), String> {
    keiro::write_stream("a", &1u8)
        .await
        .map_err(|e| e.to_string())?;
    keiro::write_stream("a", &2u8)
        .await
        .map_err(|e| e.to_string())?;
    keiro::close_stream("a").await.map_err(|e| e.to_string())?;
    keiro::write_stream("a", &3u8)
        .await
        .map_err(|e| e.to_string())?;
    keiro::recv::<()>("finish").await.map_err(|e| e.to_string())
}

/// Writes 1, 2, 3 to stream "nums" and ends.
#[workflow]
async fn producer(_tag: String) -> Result<(), String> {
    for n in 1..=3u32 {
        keiro::write_stream("nums", &n)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

static CONSUMER_RUNS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Panics the first time it runs for `key` (a crash after the reads).
#[keiro::step]
async fn crash_once_after_reading(key: String) -> bool {
    let mut runs = CONSUMER_RUNS.lock().unwrap();
    let first = !runs.contains(&key);
    runs.push(key.clone());
    drop(runs);
    if first {
        panic!("crash after reading the stream of {key}");
    }
    true
}

/// Reads another workflow's stream inside a workflow, then crashes once.
#[workflow]
async fn consumer(from: String) -> Result<Vec<u32>, String> {
    let mut items = keiro::read_stream::<u32>(from.clone(), "nums");
    let mut got = Vec::new();
    while let Some(item) = items.next().await {
        got.push(item.map_err(|e| e.to_string())?);
    }
    crash_once_after_reading(from).await;
    Ok(got)
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn events_and_streams_are_read_from_outside_while_the_workflow_runs(backend: Backend) {
    let db = TestDb::new(backend).await;
    let runner = db.keiro().await;
    let reader = db.keiro().await;
    let id = fresh("pub");
    let handle = publisher(5).id(&id).on(&runner).start().await.unwrap();
    // The workflow is still running (it waits for "finish"): events and the
    // stream so far are visible from the other runtime.
    let mut progress = None;
    for _ in 0..200 {
        progress = reader
            .get_event::<u32>(&id, "progress")
            .wait(Duration::from_secs(5))
            .await
            .unwrap();
        if progress == Some(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(progress, Some(5), "the last value wins");
    let mut lines = reader.read_stream::<String>(&id, "log");
    let mut seen = Vec::new();
    for _ in 0..5 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next())
            .await
            .expect("a line")
            .expect("the stream goes on")
            .unwrap();
        seen.push(line);
    }
    assert_eq!(
        seen,
        (1..=5).map(|i| format!("line {i}")).collect::<Vec<_>>()
    );
    assert!(
        !handle.status().await.unwrap().is_final(),
        "read while the workflow runs"
    );
    runner.send(&id, "finish", &()).await.unwrap();
    // The rest of the stream, then its end when the workflow ends.
    let rest: Vec<String> = tokio::time::timeout(
        Duration::from_secs(20),
        lines.map(|line| line.unwrap()).collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ends with the workflow");
    assert_eq!(rest, vec!["last".to_owned()]);
    assert_eq!(handle.result().await.unwrap(), Ok(5));
    // A fresh reader after the end reads everything, in order, without gaps.
    let all: Vec<String> = reader
        .read_stream::<String>(&id, "log")
        .map(|line| line.unwrap())
        .collect()
        .await;
    assert_eq!(all.len(), 6);
    assert_eq!(all[5], "last");
}

async fn an_unset_event_is_none_and_a_wrong_type_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = fresh("typed");
    let handle = publisher(1).id(&id).on(&keiro).start().await.unwrap();
    assert_eq!(
        keiro.get_event::<u32>(&id, "never").await.unwrap(),
        None,
        "unset"
    );
    let set = keiro
        .get_event::<u32>(&id, "progress")
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(set, Some(1));
    let err = keiro
        .get_event::<String>(&id, "progress")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MessageType(_)), "{err}");
    let text = err.to_string();
    for part in ["event `progress`", id.as_str(), "u32", "String"] {
        assert!(text.contains(part), "{text} should name {part}");
    }
    let err = keiro
        .get_event::<u32>("nobody", "progress")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    keiro.send(&id, "finish", &()).await.unwrap();
    handle.result().await.unwrap().unwrap();
}

async fn a_closed_stream_ends_its_readers_and_takes_no_more(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = fresh("closer");
    let handle = closer("x".into()).id(&id).on(&keiro).start().await.unwrap();
    // Still running, but the stream is closed: readers end after 1 and 2.
    let values: Vec<u8> = tokio::time::timeout(
        Duration::from_secs(10),
        keiro
            .read_stream::<u8>(&id, "a")
            .map(|v| v.unwrap())
            .collect::<Vec<_>>(),
    )
    .await
    .expect("a closed stream ends");
    assert_eq!(values, vec![1, 2]);
    assert!(!handle.status().await.unwrap().is_final());
    keiro.send(&id, "finish", &()).await.unwrap();
    handle.result().await.unwrap().unwrap();
}

async fn a_stream_read_inside_a_workflow_is_journaled_item_by_item(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.builder().max_attempts(3).connect().await.unwrap();
    let worker = keiro
        .resume_worker(
            keiro::ResumeOptions::default()
                .poll_interval(Duration::from_millis(50))
                .log(|_| {}),
        )
        .await
        .unwrap();
    let from = fresh("producer");
    producer("x".into())
        .id(&from)
        .on(&keiro)
        .await
        .unwrap()
        .unwrap();
    let id = fresh("consumer");
    let handle = consumer(from.clone())
        .id(&id)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), handle.result())
        .await
        .expect("the consumer recovers from its crash")
        .unwrap();
    assert_eq!(out, Ok(vec![1, 2, 3]));
    // Three values and the end, each journaled once, replayed after the crash.
    let journal = keiro.store().load_journal(&id, 0).await.unwrap();
    let reads = journal
        .iter()
        .filter(|row| row.kind == "read_stream")
        .count();
    assert_eq!(reads, 4, "{journal:?}");
    worker.shutdown().await;
}

on_both_backends!(
    a_stream_read_inside_a_workflow_is_journaled_item_by_item,
    events_and_streams_are_read_from_outside_while_the_workflow_runs,
    an_unset_event_is_none_and_a_wrong_type_is_refused,
    a_closed_stream_ends_its_readers_and_takes_no_more,
);
