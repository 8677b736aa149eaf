//! Cancellation and continue-as-new on both backends.

use std::time::Duration;

use keiro::{step, workflow, CancelOutcome, Error, Keiro, WorkflowHandle, WorkflowStatus};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

async fn runtime(db: &TestDb) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(format!("cn-{}", uuid::Uuid::new_v4().simple()))
        .suspend_after(Duration::from_millis(200))
        .connect()
        .await
        .unwrap()
}

#[step]
async fn numbered(key: String, n: u32) -> u32 {
    ran(&key, &format!("step {n}"));
    n
}

#[workflow]
async fn long_haul(key: String) -> u32 {
    let mut total = 0;
    for n in 0..1_000 {
        total += numbered(key.clone(), n).await;
        keiro::sleep(Duration::from_millis(20)).await;
    }
    total
}

async fn wait_for_runs(key: &str, at_least: usize) {
    for _ in 0..500 {
        if keiro_tests::runs(key).len() >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the workflow never ran {at_least} steps");
}

/// Starts a `long_haul`, waits for its third step, and cancels it: the
/// outcome names it alone. Returns its key and handle.
async fn cancel_a_running_long_haul(keiro: &Keiro) -> (String, WorkflowHandle<u32>) {
    let key = uuid::Uuid::new_v4().to_string();
    let handle = long_haul(key.clone())
        .id(&key)
        .on(keiro)
        .start()
        .await
        .unwrap();
    wait_for_runs(&key, 3).await;
    let outcome = keiro.cancel(&key).await.unwrap();
    assert_eq!(
        outcome,
        CancelOutcome::Cancelled {
            ids: vec![key.clone()]
        }
    );
    (key, handle)
}

async fn a_running_workflow_stops_at_its_next_step(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let (key, handle) = cancel_a_running_long_haul(&keiro).await;
    let ran_then = keiro_tests::runs(&key).len();
    let err = handle.result().await.unwrap_err();
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        keiro_tests::runs(&key).len() <= ran_then,
        "a step body ran after the cancel"
    );
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Cancelled);
    // Cancelling again, or a finished workflow, is a no-op that says so.
    assert_eq!(
        keiro.cancel(&key).await.unwrap(),
        CancelOutcome::AlreadyFinished(WorkflowStatus::Cancelled)
    );
    let err = keiro.cancel("no-such-workflow").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
}

async fn a_cancel_from_another_runtime_stops_the_run(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = Keiro::builder(&db.url)
        .executor_id(format!("cn-{}", uuid::Uuid::new_v4().simple()))
        .lease_ttl(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let handle = long_haul(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_for_runs(&key, 2).await;
    let other = db.keiro().await;
    assert!(matches!(
        other.cancel(&key).await.unwrap(),
        CancelOutcome::Cancelled { .. }
    ));
    // The running executor finds out at its next lease renewal (ttl / 3).
    let err = tokio::time::timeout(Duration::from_secs(5), handle.result())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    let ran_then = keiro_tests::runs(&key).len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        keiro_tests::runs(&key).len(),
        ran_then,
        "steps ran after the cancel took effect"
    );
}

#[workflow]
async fn worker_child(key: String, n: u32) -> u32 {
    long_haul(format!("{key}-grandchild-{n}"))
        .await
        .unwrap_or(0)
}

#[workflow]
async fn supervisor(key: String) -> String {
    let a = keiro::spawn(worker_child(key.clone(), 1)).await.unwrap();
    let b = keiro::spawn(worker_child(key.clone(), 2)).await.unwrap();
    match (a.await, b.await) {
        (Err(e), _) | (_, Err(e)) => format!("child error: {e}"),
        (Ok(x), Ok(y)) => format!("{x} {y}"),
    }
}

async fn cancellation_cascades_to_running_children(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = supervisor(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_for_runs(&format!("{key}-grandchild-2"), 2).await;
    let CancelOutcome::Cancelled { ids } = keiro.cancel(&key).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        ids.len(),
        5,
        "the supervisor, two children, two grandchildren: {ids:?}"
    );
    assert!(matches!(
        handle.result().await.unwrap_err(),
        Error::Cancelled { .. }
    ));
    for id in &ids {
        let row = keiro.store().get_instance(id).await.unwrap().unwrap();
        assert_eq!(row.status.as_str(), "cancelled", "{id}");
    }
}

#[workflow]
async fn cancels_its_child(key: String) -> String {
    let child = keiro::spawn(long_haul(format!("{key}-victim")))
        .await
        .unwrap();
    numbered(key.clone(), 0).await;
    match child.await {
        Ok(n) => format!("finished {n}"),
        Err(e) => format!("child: {e}"),
    }
}

async fn a_parent_awaiting_a_cancelled_child_gets_an_error(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = cancels_its_child(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_for_runs(&format!("{key}-victim"), 2).await;
    keiro.cancel(&format!("{key}/0")).await.unwrap();
    let out = handle.result().await.unwrap();
    assert!(out.contains("cancelled"), "{out}");
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);
}

#[workflow]
async fn countdown(key: String, n: u32) -> u32 {
    numbered(key.clone(), n).await;
    if n > 0 {
        return keiro::continue_as_new(countdown(key, n - 1))
            .await
            .unwrap_or(u32::MAX);
    }
    42
}

async fn continue_as_new_runs_generations_under_one_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        countdown(key.clone(), 3).id(&key).on(&keiro).await.unwrap(),
        42
    );
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.generation, row.input.clone()),
        (3, serde_json::to_string(&(key.clone(), 0)).unwrap())
    );
    for generation in 0..=3 {
        let journal = keiro.store().load_journal(&key, generation).await.unwrap();
        assert_eq!(
            journal.len(),
            1,
            "generation {generation} keeps its own journal"
        );
        assert_eq!(journal[0].result, (3 - generation).to_string());
    }
    for n in 0..=3 {
        assert_eq!(count(&key, &format!("step {n}")), 1);
    }
    let err = keiro::continue_as_new::<u32, u32>(countdown(key.clone(), 1).on(&keiro))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("inside a #[workflow]"), "{err}");
}

/// Continues as new with a call given `setting`: its error, or `done` once
/// a generation runs with `setting` "done".
#[workflow]
async fn continues_with(setting: String, own_id: String) -> String {
    if setting == "done" {
        return setting;
    }
    let call = continues_with("done".to_owned(), own_id.clone());
    let call = match setting.as_str() {
        "debounce" => call.debounce("k", Duration::from_secs(1)),
        "timeout" => call.timeout(Duration::from_secs(60)),
        "queue" => call.priority(3),
        "other id" => call.id("elsewhere"),
        _ => call.id(own_id),
    };
    match keiro::continue_as_new::<String, String>(call).await {
        Ok(never) => never,
        Err(error) => error.to_string(),
    }
}

/// A call given settings that only a new instance keeps (a debounce, a
/// timeout, queue settings, another id) is refused by
/// `keiro::continue_as_new`, naming the setting, instead of being dropped in
/// silence; its own id is accepted.
async fn continue_as_new_refuses_settings_it_would_drop(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    for (setting, named) in [
        ("debounce", "`.debounce(..)`"),
        ("timeout", "`.timeout(..)`"),
        ("queue", "queue settings"),
        ("other id", "an `.id(..)` other than its own"),
    ] {
        let id = format!("continues-with-{}", setting.replace(' ', "-"));
        let out = continues_with(setting.to_owned(), id.clone())
            .id(id.as_str())
            .on(&keiro)
            .await
            .unwrap();
        assert!(
            out.contains(named) && out.contains("continue_as_new") && out.contains(&id),
            "{setting}: {out}"
        );
    }
    let out = continues_with("own id".to_owned(), "continues-own".to_owned())
        .id("continues-own")
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, "done");
}

/// PostgreSQL: a cancel picked as a deadlock's victim (cancelling a tree
/// while a child in it times out on its own locks the same rows in opposite
/// orders) goes again: the caller gets the cancelled outcome, not the
/// deadlock. A trigger raising `40P01` on the first cancel stands in for the
/// race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cancel_that_meets_a_deadlock_goes_again() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = runtime(&db).await;
    let keiro_store::Store::Postgres(pg) = keiro::unstable::raw_store(&keiro) else {
        panic!("a PostgreSQL store");
    };
    let trigger = keiro_tests::faults::deadlock_once_on_status(pg.pool(), "cancelled").await;
    let (_, handle) = cancel_a_running_long_haul(&keiro).await;
    let err = tokio::time::timeout(Duration::from_secs(20), handle.result())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Cancelled);
    let fired = trigger.fired().await;
    assert!(fired >= 2, "the trigger fired {fired} time(s)");
}

on_both_backends!(
    a_running_workflow_stops_at_its_next_step,
    a_cancel_from_another_runtime_stops_the_run,
    cancellation_cascades_to_running_children,
    a_parent_awaiting_a_cancelled_child_gets_an_error,
    continue_as_new_runs_generations_under_one_id,
    continue_as_new_refuses_settings_it_would_drop,
);
