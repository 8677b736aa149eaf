//! Each `keiro::Error` variant a user can meet names what happened and what to
//! do, on both backends: misuse outside a workflow, an empty id, a
//! continuation as another workflow, nothing to resume, a second
//! `keiro::init`, an unregistered workflow name, and no free executor
//! identity.

use std::sync::{Arc, Mutex};

use keiro::{workflow, Error, Keiro, ResumeEvent, ResumeOptions};
use keiro_store::{now_us, ExecutorRow, NewInstance};
use keiro_tests::{on_both_backends, Backend, TestDb};

#[workflow]
async fn doubled(n: u64) -> u64 {
    n * 2
}

#[workflow]
async fn continues_as_another(n: u64) -> String {
    match keiro::continue_as_new::<u64, ()>(doubled(n)).await {
        Ok(()) => "continued".into(),
        Err(error) => format!("{error:?}"),
    }
}

#[workflow]
async fn continues_outside(n: u64) -> u64 {
    n
}

async fn workflow_only_calls_outside_a_workflow_say_so(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let err = keiro::continue_as_new::<u64, ()>(continues_outside(1).on(&keiro))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotInWorkflow { op, .. } if op.contains("continue_as_new(continues_outside)")),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("only inside a #[workflow]"),
        "{err}"
    );
    let err = keiro::awakeable::<u32>().await.await.unwrap_err();
    assert!(
        matches!(&err, Error::NotInWorkflow { op, .. } if op.contains("keiro::awakeable()")),
        "{err:?}"
    );
}

async fn an_empty_id_is_refused_naming_the_workflow(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let err = doubled(2).id("").on(&keiro).await.unwrap_err();
    assert!(
        matches!(&err, Error::EmptyId { name } if name == "doubled"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`doubled`"), "{err}");
    let err = doubled(2).id("").on(&keiro).enqueue().await.unwrap_err();
    assert!(matches!(err, Error::EmptyId { .. }), "{err:?}");
}

async fn continuing_as_another_workflow_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let out = continues_as_another(3)
        .id("cont-1")
        .on(&keiro)
        .await
        .unwrap();
    let expected = Error::ContinueAsOther {
        name: "continues_as_another".into(),
        id: "cont-1".into(),
        requested: "doubled".into(),
    };
    assert_eq!(out, expected.to_string());
    assert!(out.contains("same workflow"), "{out}");
}

async fn resuming_an_instance_not_set_aside_says_its_status(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    assert_eq!(doubled(4).id("done-1").on(&keiro).await.unwrap(), 8);
    let err = keiro.resume("done-1").await.unwrap_err();
    match &err {
        Error::NotSetAside { name, id, status } => {
            assert_eq!(
                (name.as_str(), id.as_str(), status.as_str()),
                ("doubled", "done-1", "completed")
            );
        }
        other => panic!("expected NotSetAside, got {other:?}"),
    }
    assert!(err.to_string().contains("nothing to resume"), "{err}");
    let err = keiro.resume("no-such-id").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
}

async fn an_unregistered_name_is_an_unknown_workflow_naming_the_fix(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    keiro::unstable::raw_store(&keiro)
        .create_instance(&NewInstance::new("orphan-1", "linked_nowhere", "[]"))
        .await
        .unwrap();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    let options = ResumeOptions::default().log(move |event: &ResumeEvent| {
        if let ResumeEvent::UnknownName { .. } = event {
            sink.lock().unwrap().extend(event.error());
        }
    });
    let summary = keiro.resume_once(&options).await.unwrap();
    assert_eq!(summary.unknown_name, 1);
    let errors = errors.lock().unwrap().clone();
    match errors.as_slice() {
        [error @ Error::UnknownWorkflow { name, id }] => {
            assert_eq!((name.as_str(), id.as_str()), ("linked_nowhere", "orphan-1"));
            let text = error.to_string();
            assert!(text.contains("keiro::link!"), "{text}");
            assert!(text.contains("`linked_nowhere`"), "{text}");
        }
        other => panic!("expected one UnknownWorkflow, got {other:?}"),
    }
}

async fn no_free_default_identity_is_refused_saying_what_to_set(backend: Backend) {
    let db = TestDb::new(backend).await;
    // No explicit identity: the default `{host}/{program}` and its slots.
    let keiro = Keiro::connect(&db.url).await.unwrap();
    let base = keiro.executor_id().to_owned();
    let raw = keiro::unstable::raw_store(&keiro);
    for n in 1..=64 {
        let id = if n == 1 {
            base.clone()
        } else {
            format!("{base}#{n}")
        };
        let row = ExecutorRow {
            id,
            token: format!("token-{n}"),
            host: "another-host".into(),
            pid: 1,
            heartbeat_at: now_us() + 60_000_000,
        };
        assert!(raw.put_executor(&row, None).await.unwrap());
    }
    let err = keiro
        .resume_once(&ResumeOptions::default().log(|_| {}))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoExecutorId { .. }), "{err:?}");
    assert!(err.to_string().contains("KEIRO_EXECUTOR_ID"), "{err}");
    assert!(err.to_string().contains(&base), "{err}");
}

on_both_backends!(
    workflow_only_calls_outside_a_workflow_say_so,
    an_empty_id_is_refused_naming_the_workflow,
    continuing_as_another_workflow_is_refused,
    resuming_an_instance_not_set_aside_says_its_status,
    an_unregistered_name_is_an_unknown_workflow_naming_the_fix,
    no_free_default_identity_is_refused_saying_what_to_set,
);

/// The only test in this binary that installs the process-wide runtime.
#[tokio::test]
async fn a_second_init_is_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    keiro::init(db.keiro().await).unwrap();
    let err = keiro::init(db.keiro().await).unwrap_err();
    assert!(matches!(err, Error::AlreadyInitialized), "{err:?}");
    assert!(err.to_string().contains("keiro::init once"), "{err}");
}
