//! Link-time registration, seen from outside: a worker binary that never
//! names the crate defining a workflow does not serve it, says so in its
//! start-up log, and a caller waiting on such an instance is told instead of
//! waiting forever; `keiro::link!` fixes it. Real worker processes, both
//! backends.

use std::time::{Duration, Instant};

use keiro::Error;
use keiro_test_linked::linked_greeting;
use keiro_tests::process::CrashChild;
use keiro_tests::{on_both_backends, Backend, TestDb};

on_both_backends!(an_unlinked_workflow_is_reported_and_link_makes_a_worker_serve_it);

async fn an_unlinked_workflow_is_reported_and_link_makes_a_worker_serve_it(backend: Backend) {
    let db = TestDb::new(backend).await;

    // A worker that depends on the crate but never names it.
    let mut unlinked = CrashChild::start(
        env!("CARGO_BIN_EXE_worker_unlinked"),
        &db,
        "unlinked",
        &[],
        None,
    );
    let served = unlinked.line_containing("keiro resume worker serves").await;
    assert!(
        !served.contains("linked_greeting"),
        "the unlinked worker must not serve linked_greeting: {served}"
    );

    let keiro = keiro::Keiro::builder(&db.url)
        .executor_id("caller")
        .no_worker_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let handle = linked_greeting("ada".into())
        .id("greet-1")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let started = Instant::now();
    let error = tokio::time::timeout(Duration::from_secs(30), handle.result())
        .await
        .expect("result() must not wait forever when no worker serves the workflow")
        .expect_err("no worker serves linked_greeting");
    assert!(
        matches!(&error, Error::NoWorker { name, id, .. } if name == "linked_greeting" && id == "greet-1"),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(text.contains("keiro::link!"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "waited out the timeout"
    );
    assert_eq!(
        handle.status().await.unwrap(),
        keiro::WorkflowStatus::Pending,
        "nothing about the instance changed"
    );

    // The same worker with `keiro::link!` serves it and logs so.
    let mut linked = CrashChild::start(
        env!("CARGO_BIN_EXE_worker_linked"),
        &db,
        "linked",
        &[],
        None,
    );
    let served = linked.line_containing("keiro resume worker serves").await;
    assert!(served.contains("linked_greeting"), "{served}");
    let out = tokio::time::timeout(Duration::from_secs(30), handle.result())
        .await
        .expect("the linked worker runs it")
        .unwrap();
    assert_eq!(out, "hello, ada");
    unlinked.kill().await;
    linked.kill().await;
}
