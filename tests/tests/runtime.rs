//! The runtime's contract on both backends: idempotent ids, handles, status,
//! non-determinism set aside and resumed, undecodable rows refused by name,
//! child workflows, and bad URLs.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};

use keiro::{step, workflow, Error, ResumeEvent, ResumeOptions, WorkflowStatus};
use keiro_store::{NewInstance, StepRow};
use keiro_tests::deployments::{deploy, version};
use keiro_tests::{count, on_both_backends, ran, runs, Backend, TestDb};

#[step]
async fn note(key: String, what: String) -> String {
    ran(&key, &what);
    what
}

#[workflow]
async fn greet(key: String, name: String) -> String {
    let hello = note(key, format!("hello {name}")).await;
    format!("{hello}!")
}

#[workflow(name = "farewell")]
async fn say_goodbye(key: String) -> String {
    note(key, "bye".into()).await
}

async fn same_id_for_another_workflow_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    greet(key.clone(), "ada".into())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    let err = say_goodbye(key.clone())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::IdConflict { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("`greet`") && text.contains("`farewell`") && text.contains(&key),
        "{text}"
    );
    assert_eq!(runs(&key), ["hello ada"]);
}

async fn start_runs_in_the_background_and_handles_see_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = greet(key.clone(), "bob".into())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    assert_eq!(handle.id(), key);
    assert_eq!(handle.result().await.unwrap(), "hello bob!");
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);
    // A second start of the same call attaches and runs nothing.
    let again = greet(key.clone(), "bob".into())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    assert_eq!(again.result().await.unwrap(), "hello bob!");
    assert_eq!(runs(&key), ["hello bob"]);
    // Without an id a fresh UUID is chosen.
    let fresh = greet(key.clone(), "cy".into())
        .on(&keiro)
        .start()
        .await
        .unwrap();
    assert!(uuid::Uuid::parse_str(fresh.id()).is_ok());
    fresh.result().await.unwrap();
    // A handle by id, from another runtime on the same database.
    let other = db.keiro().await;
    let by_id = other.handle::<String>(&key).await.unwrap();
    assert_eq!(by_id.result().await.unwrap(), "hello bob!");
    let missing = other.handle::<String>("no-such-id").await.unwrap_err();
    assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
    assert!(missing.to_string().contains("no-such-id"));
}

async fn concurrent_calls_of_one_id_run_it_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let calls = (0..8).map(|_| {
        greet(key.clone(), "eve".into())
            .id(&key)
            .on(&keiro)
            .into_future()
    });
    let outs = futures::future::join_all(calls).await;
    for out in outs {
        assert_eq!(out.unwrap(), "hello eve!");
    }
    assert_eq!(count(&key, "hello eve"), 1);
}

#[step]
async fn alpha(key: String) -> u32 {
    ran(&key, "alpha");
    1
}

#[step]
async fn beta(key: String) -> u32 {
    ran(&key, "beta");
    2
}

#[step]
async fn gate(key: String) -> u32 {
    if version(&key) == 1 {
        panic!("version 1 crashes here");
    }
    ran(&key, "gate");
    10
}

#[workflow]
async fn evolving(key: String) -> u32 {
    let first = if version(&key) == 2 {
        beta(key.clone()).await
    } else {
        alpha(key.clone()).await
    };
    first + gate(key).await
}

async fn non_determinism_sets_aside_and_resumes_after_a_fix(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    deploy(&key, 1);
    evolving(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    assert_eq!(runs(&key), ["alpha"]);
    let journal_before = keiro.store().load_journal(&key, 0).await.unwrap();

    // Version 2 calls `beta` where the journal recorded `alpha`.
    deploy(&key, 2);
    let err = evolving(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    let Error::NonDeterministic {
        seq,
        ref expected,
        ref found,
        ..
    } = err
    else {
        panic!("expected non-determinism, got {err}");
    };
    assert_eq!(seq, 0);
    assert!(
        expected.contains("alpha") && found.contains("beta"),
        "{err}"
    );
    assert!(
        err.to_string().contains(&key) && err.to_string().contains("evolving"),
        "{err}"
    );
    assert_eq!(
        keiro.store().load_journal(&key, 0).await.unwrap(),
        journal_before
    );
    assert_eq!(runs(&key), ["alpha"], "no step body ran");
    let handle = keiro.handle::<u32>(&key).await.unwrap();
    match handle.status().await.unwrap() {
        WorkflowStatus::NonDeterministic { expected, found } => {
            assert!(expected.contains("alpha") && found.contains("beta"));
        }
        other => panic!("status {other:?}"),
    }
    // Set aside: calling again does not run it.
    let again = evolving(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    assert!(matches!(again, Error::NonDeterministic { .. }));

    // Version 3 is the fix: resume, and it continues from the journal.
    deploy(&key, 3);
    keiro.resume(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Pending);
    assert_eq!(evolving(key.clone()).id(&key).on(&keiro).await.unwrap(), 11);
    assert_eq!(runs(&key), ["alpha", "gate"]);
    let err = keiro.resume(&key).await.unwrap_err();
    assert!(err.to_string().contains("completed"), "{err}");
    assert!(
        matches!(&err, Error::NotSetAside { id, status, .. } if *id == key && status == "completed"),
        "{err:?}"
    );
}

#[workflow]
async fn shorter(key: String) -> u32 {
    alpha(key).await
}

async fn journal_entries_the_code_never_reaches_are_non_determinism(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let input = serde_json::to_string(&(key.clone(),)).unwrap();
    keiro::unstable::raw_store(&keiro)
        .create_instance(&NewInstance::new(&key, "shorter", &input))
        .await
        .unwrap();
    let rows = [("alpha", "1"), ("beta", "2")].map(|(name, result)| StepRow {
        workflow_id: key.clone(),
        generation: 0,
        seq: if name == "alpha" { 0 } else { 1 },
        name: name.into(),
        kind: "step".into(),
        result: result.into(),
    });
    keiro::unstable::raw_store(&keiro)
        .append_steps(&rows)
        .await
        .unwrap();
    let err = shorter(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    let Error::NonDeterministic { seq, expected, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((*seq, expected.as_str()), (1, "step `beta`"));
    assert_eq!(keiro.store().load_journal(&key, 0).await.unwrap().len(), 2);
}

async fn undecodable_rows_are_refused_by_name_and_kept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;

    // A stored input whose type changed.
    let id = format!("bad-input-{}", uuid::Uuid::new_v4());
    keiro::unstable::raw_store(&keiro)
        .create_instance(&NewInstance::new(&id, "greet", r#"{"old":1}"#))
        .await
        .unwrap();
    // A call with today's arguments is another call: refused, not attached.
    let err = greet("k".into(), "x".into())
        .id(&id)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InputMismatch { .. }), "{err}");
    // The worker, which runs what is stored, cannot decode it: a crash that
    // names the workflow, the id and the input.
    let crashes = Arc::new(Mutex::new(Vec::new()));
    let seen = crashes.clone();
    let options = ResumeOptions::default().log(move |event| {
        if let ResumeEvent::Crashed { error, .. } = event {
            seen.lock().unwrap().push(error.clone());
        }
    });
    keiro.resume_once(&options).await.unwrap();
    let err = crashes.lock().unwrap().pop().expect("a crash");
    assert!(matches!(err, Error::Decode { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("`greet`") && text.contains(&id) && text.contains("input"),
        "{text}"
    );
    let row = keiro.store().get_instance(&id).await.unwrap().unwrap();
    assert_eq!(row.input, r#"{"old":1}"#);
    assert!(!row.status.is_final());

    // A recorded step result whose type changed.
    let key = uuid::Uuid::new_v4().to_string();
    let input = serde_json::to_string(&(key.clone(), "x")).unwrap();
    keiro::unstable::raw_store(&keiro)
        .create_instance(&NewInstance::new(&key, "greet", &input))
        .await
        .unwrap();
    let bad = StepRow {
        workflow_id: key.clone(),
        generation: 0,
        seq: 0,
        name: "note".into(),
        kind: "step".into(),
        result: "42".into(),
    };
    keiro::unstable::raw_store(&keiro)
        .append_steps(std::slice::from_ref(&bad))
        .await
        .unwrap();
    let err = greet(key.clone(), "x".into())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Decode { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("`note`") && text.contains("`greet`") && text.contains(&key),
        "{text}"
    );
    assert_eq!(keiro.store().load_journal(&key, 0).await.unwrap(), [bad]);
    assert!(runs(&key).is_empty());
}

#[workflow]
async fn child(key: String, n: u32) -> u32 {
    let _ = note(key, format!("child {n}")).await;
    n * 10
}

#[workflow]
async fn parent(key: String) -> u32 {
    let a = child(key.clone(), 1).await.unwrap();
    let b = child(key.clone(), 2)
        .id(format!("{key}-named-child"))
        .await
        .unwrap();
    note(key.clone(), "parent".into()).await;
    a + b
}

async fn awaited_workflows_run_as_children_with_deterministic_ids(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(parent(key.clone()).id(&key).on(&keiro).await.unwrap(), 30);
    let first = keiro
        .store()
        .get_instance(&format!("{key}/0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.parent_id.as_deref(), first.parent_seq),
        (Some(key.as_str()), Some(0))
    );
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    let kinds: Vec<_> = journal
        .iter()
        .map(|r| (r.kind.as_str(), r.name.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [("child", "child"), ("child", "child"), ("step", "note")]
    );
    assert_eq!(runs(&key), ["child 1", "child 2", "parent"]);
}

on_both_backends!(
    same_id_for_another_workflow_is_refused,
    start_runs_in_the_background_and_handles_see_it,
    concurrent_calls_of_one_id_run_it_once,
    non_determinism_sets_aside_and_resumes_after_a_fix,
    journal_entries_the_code_never_reaches_are_non_determinism,
    undecodable_rows_are_refused_by_name_and_kept,
    awaited_workflows_run_as_children_with_deterministic_ids,
);

#[tokio::test]
async fn bad_urls_are_refused_naming_the_url() {
    let err = keiro::Keiro::connect("mysql://db/keiro").await.unwrap_err();
    assert!(err.to_string().contains("mysql://db/keiro"), "{err}");
    let err = keiro::Keiro::connect("postgres://u:hunter2@127.0.0.1:1/keiro")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("127.0.0.1:1") && !text.contains("hunter2"),
        "{text}"
    );
    assert!(err.is_transient());
    let err = keiro::Keiro::connect("sqlite:/nonexistent-dir/sub/keiro.db")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent-dir/sub/keiro.db"),
        "{err}"
    );
}
