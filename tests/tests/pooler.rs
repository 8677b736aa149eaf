//! keiro behind pgbouncer in transaction pooling mode, beyond the
//! conformance and crash suites (which run there too): push wakes through a
//! direct `listen_url`, and a clear refusal of a pooler setting keiro does
//! not know.

use std::process::Stdio;
use std::time::Duration;

use keiro::Keiro;
use keiro_tests::workflows::three_marks;
use keiro_tests::{Backend, TestDb};
use sqlx::Connection;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const CHILD: &str = env!("CARGO_BIN_EXE_crash_workflow");

/// A worker process behind pgbouncer that polls only once a minute still
/// picks up work enqueued by another process at once: its `LISTEN` runs on
/// the direct `KEIRO_LISTEN_URL`, and the enqueue's `NOTIFY` (sent through
/// the proxy, in the enqueue's own transaction) reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_behind_pgbouncer_is_woken_through_its_listen_url() {
    let db = TestDb::new(Backend::PgBouncer).await;
    assert_ne!(db.url, db.direct_url);
    let mut worker = Command::new(CHILD)
        .args(["worker", "60000"])
        .env("KEIRO_DATABASE_URL", &db.url)
        .env("KEIRO_LISTEN_URL", &db.direct_url)
        .env(
            "KEIRO_EXECUTOR_ID",
            format!("pooled-{}", uuid::Uuid::new_v4().simple()),
        )
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    assert_eq!(ready.unwrap().unwrap().as_deref(), Some("READY"));
    // Its listener starts beside its first pass: a notification sent before
    // its LISTEN reaches nobody, and the worker would wait for its poll.
    let mut direct = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(&mut direct)
        .await
        .unwrap();
        if listening > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    direct.close().await.unwrap();

    // This process only enqueues (through the proxy) and waits.
    let keiro = db.keiro().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("marks.log");
    for w in 0..3u32 {
        let handle = three_marks(file.to_str().unwrap().to_owned(), w)
            .id(format!("pushed-{w}"))
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(20), handle.result())
            .await
            .expect("the worker was woken before its one-minute poll")
            .unwrap();
        assert_eq!(out, w * 10 + 3);
    }
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    keiro.shutdown().await.unwrap();
}

/// A pooler keiro does not know is refused before anything connects, naming
/// the value and the accepted ones.
#[tokio::test]
async fn an_unknown_pooler_is_refused_by_name() {
    let db = TestDb::new(Backend::Postgres).await;
    let url = format!("{}?pooler=statement", db.url);
    let error = Keiro::builder(&url).connect().await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("unknown pooler `statement`"), "{message}");
    assert!(message.contains("pooler=transaction"), "{message}");
}
