//! Messages, events and streams across processes and real crashes (SIGKILL
//! of the child process running the workflow), on both backends: events and
//! streams are read from this process while the child's workflow runs, a
//! message sent while the receiver's process is dead is received after
//! restart, a stream written across a crash has no gaps and no duplicates,
//! and a receive deadline crossing a kill fires at the original deadline.

use std::time::{Duration, Instant};

use futures::StreamExt;
use keiro_tests::process::{lines_of, CrashChild};
use keiro_tests::{on_every_backend, Backend, TestDb};

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

fn executor() -> String {
    format!("mailbox-test-{}", uuid::Uuid::new_v4().simple())
}

async fn killed_mid_stream_and_sent_to_while_dead(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let file = file.to_str().unwrap();
    let id = "mailbox-1";
    let executor = executor();
    let args = ["mailbox", id, file, "300"];
    let mut first = CrashChild::start(CHILD, &db, &executor, &args, Some("streamed-2"));
    first.line_starting("CRASH_POINT").await;
    first.kill().await;

    // The receiver's process is dead: the message waits in its queue.
    let keiro = db.keiro().await;
    keiro.send(id, "inbox", &7u32).await.unwrap();

    let (out, _) = CrashChild::start(CHILD, &db, &executor, &["resume", id], None)
        .done()
        .await;
    assert_eq!(out, serde_json::json!({"Ok": [7, true]}));
    assert_eq!(lines_of(&dir.path().join("effects.log")), vec!["got 7"]);
    // Entries 1 and 2 were journaled before the kill; the replay did not
    // write them again, and 3 came after: no gap, no duplicate.
    let log: Vec<u32> = keiro
        .read_stream::<u32>(id, "log")
        .map(|v| v.unwrap())
        .collect()
        .await;
    assert_eq!(log, vec![1, 2, 3]);
}

async fn a_receive_deadline_crossing_a_kill_keeps_its_original_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("effects.log");
    let id = "mailbox-2";
    let executor = executor();
    let keiro = db.keiro().await;
    let args = ["mailbox", id, file.to_str().unwrap(), "4000"];
    let mut first = CrashChild::start(CHILD, &db, &executor, &args, None);
    first.line_starting("RECEIVING").await;
    // Read from this process while the workflow runs in the child.
    let stage: Option<String> = keiro.get_event(id, "stage").await.unwrap();
    assert_eq!(stage.as_deref(), Some("receiving"));
    let mut log = keiro.read_stream::<u32>(id, "log");
    let mut so_far = Vec::new();
    for _ in 0..3 {
        let next = tokio::time::timeout(Duration::from_secs(10), log.next()).await;
        so_far.push(
            next.expect("an entry")
                .expect("the stream goes on")
                .unwrap(),
        );
    }
    assert_eq!(
        so_far,
        vec![1, 2, 3],
        "read while the child's workflow runs"
    );
    keiro.send(id, "inbox", &5u32).await.unwrap();
    first.line_starting("DEADLINE_WAIT").await;
    let waiting_since = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    first.kill().await;

    let (out, _) = CrashChild::start(CHILD, &db, &executor, &["resume", id], None)
        .done()
        .await;
    let elapsed = waiting_since.elapsed();
    assert_eq!(out, serde_json::json!({"Ok": [5, true]}));
    // A deadline reset by the replay would end 4 s after the restart
    // (6.5 s or more); the journaled one ends 4 s after the first wait.
    assert!(
        elapsed >= Duration::from_millis(3800) && elapsed < Duration::from_millis(6000),
        "the receive ended {elapsed:?} after it began waiting"
    );
}

on_every_backend!(
    killed_mid_stream_and_sent_to_while_dead,
    a_receive_deadline_crossing_a_kill_keeps_its_original_time,
);
