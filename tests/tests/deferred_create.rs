//! A workflow awaited in the runtime that runs it is recorded with its first
//! step, or with its end when it has none (one commit), on both backends:
//! what that leaves in the store, and that callers racing on one id still
//! run each step once and get one result.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::{Mutex, OnceLock};

use keiro::{step, workflow, Error, Keiro};
use keiro_store::InstanceStatus;
use keiro_tests::{on_both_backends, Backend, TestDb};

/// No step: returns `n * 2`.
#[workflow]
async fn doubled(n: u32) -> u32 {
    n * 2
}

fn step_runs() -> &'static Mutex<HashMap<String, usize>> {
    static RUNS: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    RUNS.get_or_init(Default::default)
}

/// Counts its runs under `key`; returns `n + 1`.
#[step]
async fn counted(key: String, n: u32) -> u32 {
    *step_runs().lock().unwrap().entry(key).or_default() += 1;
    n + 1
}

/// One counted step.
#[workflow]
async fn one_step(key: String, n: u32) -> u32 {
    counted(key, n).await
}

async fn a_workflow_without_steps_is_recorded_with_its_end(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    assert_eq!(doubled(21).on(&keiro).id("short").await.unwrap(), 42);
    let row = keiro::unstable::raw_store(&keiro)
        .get_instance("short")
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(row.status, InstanceStatus::Completed);
    assert_eq!(row.output.as_deref(), Some("42"));
    assert_eq!(row.lease_owner, None);
    // Inserted and finished in one transaction.
    assert_eq!(row.created_at, row.updated_at, "{row:?}");
    // Awaited again: its stored result, not a second instance.
    assert_eq!(doubled(21).on(&keiro).id("short").await.unwrap(), 42);

    // With a step it is recorded before the step runs, and ends later.
    let key = format!("{backend:?}-recorded");
    assert_eq!(
        one_step(key.clone(), 1)
            .on(&keiro)
            .id("stepped")
            .await
            .unwrap(),
        2
    );
    let row = keiro::unstable::raw_store(&keiro)
        .get_instance("stepped")
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(row.status, InstanceStatus::Completed);
    assert!(row.created_at < row.updated_at, "{row:?}");
    keiro.shutdown().await.unwrap();
}

async fn callers_racing_on_one_id_run_each_step_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Two runtimes, as two processes would be.
    let (a, b): (Keiro, Keiro) = (db.keiro().await, db.keiro().await);
    for round in 0..10 {
        let id = format!("race-{round}");
        let key = format!("{backend:?}-{id}");
        let (x, y) = tokio::join!(
            one_step(key.clone(), round).on(&a).id(&id).into_future(),
            one_step(key.clone(), round).on(&b).id(&id).into_future(),
        );
        assert_eq!(x.unwrap(), round + 1);
        assert_eq!(y.unwrap(), round + 1);
        assert_eq!(
            step_runs().lock().unwrap()[&key],
            1,
            "{id}: the step ran twice"
        );

        let id = format!("race-short-{round}");
        let (x, y) = tokio::join!(
            doubled(round).on(&a).id(&id).into_future(),
            doubled(round).on(&b).id(&id).into_future(),
        );
        assert_eq!((x.unwrap(), y.unwrap()), (round * 2, round * 2));
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

async fn an_id_taken_by_another_call_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    assert_eq!(doubled(1).on(&keiro).id("taken").await.unwrap(), 2);
    // Same workflow, other arguments; then another workflow under the id.
    let other = doubled(2).on(&keiro).id("taken").await;
    assert!(
        matches!(other, Err(Error::InputMismatch { .. })),
        "{other:?}"
    );
    let key = format!("{backend:?}-taken");
    let other = one_step(key.clone(), 1).on(&keiro).id("taken").await;
    assert!(matches!(other, Err(Error::IdConflict { .. })), "{other:?}");
    assert!(
        !step_runs().lock().unwrap().contains_key(&key),
        "its step never runs"
    );
    keiro.shutdown().await.unwrap();
}

/// Short workflows awaited one by one in one runtime (each recorded alone,
/// in one statement that commits on its own) while another runtime on the
/// same database keeps its writer busy with concurrent workflows: every one
/// is recorded with its result, none refused for a busy database.
async fn lone_ends_commit_beside_a_busy_writer(backend: Backend) {
    use futures::StreamExt;
    let db = TestDb::new(backend).await;
    let (a, b): (Keiro, Keiro) = (db.keiro().await, db.keiro().await);
    let lone = async {
        for n in 0..150u32 {
            let out = doubled(n).on(&a).id(format!("lone-{n}")).await;
            assert_eq!(out.unwrap(), n * 2, "lone-{n}");
        }
    };
    let busy = futures::stream::iter(0..300u32)
        .map(|n| {
            let key = format!("{backend:?}-busy-{n}");
            one_step(key, n)
                .on(&b)
                .id(format!("busy-{n}"))
                .into_future()
        })
        .buffer_unordered(32)
        .for_each(|out| async move {
            out.unwrap();
        });
    tokio::join!(lone, busy);
    let store = keiro::unstable::raw_store(&a);
    for n in 0..150u32 {
        let row = store.get_instance(&format!("lone-{n}")).await.unwrap();
        let row = row.unwrap_or_else(|| panic!("lone-{n} was not recorded"));
        assert_eq!(row.status, InstanceStatus::Completed);
        assert_eq!(row.output, Some((n * 2).to_string()));
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

on_both_backends!(
    a_workflow_without_steps_is_recorded_with_its_end,
    callers_racing_on_one_id_run_each_step_once,
    an_id_taken_by_another_call_is_refused,
    lone_ends_commit_beside_a_busy_writer,
);
