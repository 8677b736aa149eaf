//! A workflow id names one call. Reusing it with the same arguments attaches
//! to the instance (its stored result once finished); with other arguments,
//! or from a workflow of the same name with other types, it is refused,
//! whether the call is awaited, started, enqueued or made by a parent.
//! `keiro::handle` reads any instance whatever its arguments.

use std::collections::BTreeMap;

use keiro::{step, workflow, Error, Keiro};
use keiro_store::{NewInstance, ParentLink};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

#[step]
async fn note(key: String, what: String) -> String {
    ran(&key, &what);
    what
}

#[workflow]
async fn greet(key: String, name: String) -> String {
    note(key, format!("hello {name}")).await
}

#[workflow]
async fn tally(key: String, counts: BTreeMap<String, u32>) -> u32 {
    note(key, "tally".into()).await;
    counts.values().sum()
}

#[workflow]
async fn countdown_from(key: String, n: u32) -> u32 {
    note(key.clone(), format!("at {n}")).await;
    if n > 0 {
        return keiro::continue_as_new(countdown_from(key, n - 1))
            .await
            .unwrap_or(u32::MAX);
    }
    n
}

/// Calls `greet` as its first child (id `<parent id>/0`) and reports what
/// the call gave.
#[workflow]
async fn parent_of_greet(key: String, name: String) -> String {
    match greet(key, name).await {
        Ok(out) => out,
        Err(error @ Error::InputMismatch { .. }) => format!("refused: {error}"),
        Err(error) => format!("other error: {error}"),
    }
}

fn assert_input_mismatch(err: &Error, name: &str, id: &str) {
    assert!(matches!(err, Error::InputMismatch { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("`{name}`"))
            && text.contains(&format!("`{id}`"))
            && text.contains("different arguments")
            && text.contains("keiro::handle"),
        "{text}"
    );
}

async fn awaiting_an_id_with_other_arguments_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let first = greet(key.clone(), "ada".into()).id(&key).on(&keiro);
    assert_eq!(first.await.unwrap(), "hello ada");

    let err = greet(key.clone(), "bob".into())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert_input_mismatch(&err, "greet", &key);

    // The same call attaches to the stored result; nothing runs again.
    let again = greet(key.clone(), "ada".into()).id(&key).on(&keiro);
    assert_eq!(again.await.unwrap(), "hello ada");
    assert_eq!(count(&key, "hello ada"), 1);
    assert_eq!(count(&key, "hello bob"), 0);
    // Asking for the stored result explicitly never checks arguments.
    let stored = keiro.handle::<String>(&key).await.unwrap();
    assert_eq!(stored.result().await.unwrap(), "hello ada");
}

async fn starting_or_enqueueing_an_id_with_other_arguments_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let call = |name: &str| greet(key.clone(), name.into()).id(&key).on(&keiro);
    call("ada").enqueue().await.unwrap();

    let err = call("bob").enqueue().await.unwrap_err();
    assert_input_mismatch(&err, "greet", &key);
    let err = call("bob").start().await.unwrap_err();
    assert_input_mismatch(&err, "greet", &key);

    // The same call attaches, whichever way it is made.
    call("ada").enqueue().await.unwrap();
    let started = call("ada").start().await.unwrap();
    assert_eq!(started.result().await.unwrap(), "hello ada");
    // Also while this process is running it: the attach is checked too.
    let err = call("bob").start().await.unwrap_err();
    assert_input_mismatch(&err, "greet", &key);
    assert_eq!(call("ada").await.unwrap(), "hello ada");
    assert_eq!(count(&key, "hello ada"), 1);
    assert_eq!(count(&key, "hello bob"), 0);
}

async fn equal_arguments_encoded_in_another_order_attach(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    // Stored by a caller whose map serialized its keys in another order (a
    // `HashMap`): the same value, another text.
    let stored = format!(r#"["{key}",{{"b":2,"a":1}}]"#);
    let counts = BTreeMap::from([("a".to_owned(), 1), ("b".to_owned(), 2)]);
    assert_ne!(
        serde_json::to_string(&(key.clone(), counts.clone())).unwrap(),
        stored
    );
    keiro::unstable::raw_store(&keiro)
        .create_instance(&NewInstance::new(&key, "tally", &stored))
        .await
        .unwrap();
    let out = tally(key.clone(), counts).id(&key).on(&keiro).await;
    assert_eq!(out.unwrap(), 3);
    let other = BTreeMap::from([("a".to_owned(), 1)]);
    let err = tally(key.clone(), other).id(&key).on(&keiro).await;
    assert_input_mismatch(&err.unwrap_err(), "tally", &key);
}

async fn continue_as_new_keeps_the_original_call_attachable(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let call = |n: u32| countdown_from(key.clone(), n).id(&key).on(&keiro);
    assert_eq!(call(2).await.unwrap(), 0);
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(row.generation, 2);

    // The id names the call that started it, not its last generation.
    assert_eq!(call(2).await.unwrap(), 0);
    assert_input_mismatch(&call(0).await.unwrap_err(), "countdown_from", &key);
    assert_input_mismatch(&call(1).start().await.unwrap_err(), "countdown_from", &key);
    assert_eq!(count(&key, "at 2"), 1);
}

async fn a_child_attaching_with_other_arguments_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    // Each parent's first child was recorded by an earlier run of the parent
    // (one whose code called it with "ada"), not yet run.
    let input = serde_json::to_string(&(key.clone(), "ada")).unwrap();
    for parent in ["p-same", "p-other"] {
        let child_id = format!("{parent}/0");
        keiro::unstable::raw_store(&keiro)
            .create_instance(&NewInstance {
                id: &child_id,
                name: "greet",
                input: &input,
                signature: None,
                parent: Some(ParentLink {
                    id: parent,
                    generation: 0,
                    seq: 0,
                }),
                lease: None,
                deadline: None,
                traceparent: None,
                app_version: None,
                skeleton_hash: None,
            })
            .await
            .unwrap();
    }
    let parent = |id: &str, name: &str| parent_of_greet(key.clone(), name.into()).id(id).on(&keiro);
    // The same call attaches to the recorded child and runs it.
    assert_eq!(parent("p-same", "ada").await.unwrap(), "hello ada");
    // With other arguments the parent's call gets the error to handle.
    let out = parent("p-other", "bob").await.unwrap();
    assert!(
        out.starts_with("refused: ") && out.contains("`p-other/0`"),
        "{out}"
    );
    assert_eq!(count(&key, "hello ada"), 1);
    assert_eq!(count(&key, "hello bob"), 0);
    let child = keiro.store().get_instance("p-other/0").await.unwrap();
    assert_eq!(child.unwrap().attempts, 0);
}

async fn an_id_of_another_binarys_same_named_workflow_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro: Keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    // Enqueued by a binary whose `greet` takes other types; its arguments
    // encode to the same JSON as this call's.
    let input = serde_json::to_string(&(key.clone(), "ada")).unwrap();
    let theirs = "(Key,Name)->Greeting";
    keiro::unstable::raw_store(&keiro)
        .create_instance(&NewInstance {
            signature: Some(theirs),
            ..NewInstance::new(&key, "greet", &input)
        })
        .await
        .unwrap();
    for err in [
        greet(key.clone(), "ada".into())
            .id(&key)
            .on(&keiro)
            .await
            .unwrap_err(),
        greet(key.clone(), "ada".into())
            .id(&key)
            .on(&keiro)
            .enqueue()
            .await
            .unwrap_err(),
    ] {
        let Error::SignatureMismatch {
            name,
            id,
            stored,
            requested,
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!((name.as_str(), id.as_str()), ("greet", key.as_str()));
        assert_eq!(stored, theirs);
        assert_eq!(requested, "(String,String)->String");
        let text = err.to_string();
        assert!(text.contains(theirs) && text.contains(&key), "{text}");
    }
    assert_eq!(count(&key, "hello ada"), 0);
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!((row.attempts, row.lease_owner), (0, None));
}

on_both_backends!(
    awaiting_an_id_with_other_arguments_is_refused,
    starting_or_enqueueing_an_id_with_other_arguments_is_refused,
    equal_arguments_encoded_in_another_order_attach,
    continue_as_new_keeps_the_original_call_attachable,
    a_child_attaching_with_other_arguments_is_refused,
    an_id_of_another_binarys_same_named_workflow_is_refused,
);
