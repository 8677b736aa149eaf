//! Hostile input: ids and values a database or a replay would choke on are
//! refused up front, saying what and where, and never take unrelated
//! workflows down with them.
//!
//! - An id with a NUL byte or over [`keiro::MAX_ID_BYTES`] is
//!   [`Error::InvalidId`], while the good workflows started beside it (and
//!   sharing its group commit before this check) all complete.
//! - A step or workflow value JSON cannot store (NaN, infinity) fails the
//!   workflow with an error naming workflow, id and step; no `null` is
//!   journaled in its place.
//! - Input nested deeper than a replay reads back is refused at start.

use std::future::IntoFuture;

use futures::future::join_all;
use keiro::{step, workflow, Error, WorkflowStatus, MAX_ID_BYTES};
use keiro_store::{Store, StoreOptions};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

on_both_backends!(
    bad_ids_fail_alone_among_good_starts,
    a_step_returning_nan_fails_the_workflow_naming_the_step,
    a_workflow_returning_infinity_gives_its_caller_the_reason,
    input_nested_too_deep_is_refused_at_start,
);

#[step]
async fn double(key: String, n: u32) -> u32 {
    ran(&key, "double");
    n * 2
}

#[workflow]
async fn doubled(key: String, n: u32) -> u32 {
    double(key, n).await
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Charge {
    currency: String,
    total: f64,
}

#[step]
async fn reserve(key: String) -> String {
    ran(&key, "reserve");
    "hold-1".into()
}

#[step]
async fn charge(key: String) -> Charge {
    ran(&key, "charge");
    Charge {
        currency: "EUR".into(),
        total: f64::NAN,
    }
}

#[workflow]
async fn nan_checkout(key: String) -> f64 {
    reserve(key.clone()).await;
    charge(key).await.total
}

#[workflow]
async fn boundless(key: String) -> f64 {
    ran(&key, "boundless");
    f64::INFINITY
}

#[workflow]
async fn depth_of(input: serde_json::Value) -> u32 {
    let mut depth = 0;
    let mut at = &input;
    while let Some(inner) = at.get(0) {
        depth += 1;
        at = inner;
    }
    depth
}

/// A store of its own on the test's database, to read what was journaled.
async fn store_of(db: &TestDb) -> Store {
    Store::connect(&db.url, &StoreOptions::default())
        .await
        .expect("connect a reading store")
}

async fn bad_ids_fail_alone_among_good_starts(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let nul_id = format!("{key}-nul\0id");
    let long_id = format!("{key}-{}", "x".repeat(MAX_ID_BYTES));
    let mut ids: Vec<String> = (0..50).map(|i| format!("{key}-{i}")).collect();
    ids.insert(17, nul_id.clone());
    ids.insert(40, long_id.clone());

    // Launched together, so before ids were checked the bad ones shared the
    // good ones' group-commit transactions.
    let calls = ids.iter().enumerate().map(|(n, id)| {
        doubled(key.clone(), n as u32)
            .id(id.clone())
            .on(&keiro)
            .into_future()
    });
    let results = join_all(calls).await;

    for (n, (id, result)) in ids.iter().zip(&results).enumerate() {
        if *id == nul_id || *id == long_id {
            let Err(Error::InvalidId {
                what,
                value_preview,
                reason,
            }) = result
            else {
                panic!("a bad id must be refused as InvalidId, got {result:?}");
            };
            assert_eq!(what, &"workflow id");
            assert!(value_preview.len() < 200, "{value_preview}");
            if *id == nul_id {
                assert!(value_preview.contains("nul\\0id"), "{value_preview}");
                assert!(reason.contains("NUL byte at byte"), "{reason}");
            } else {
                assert!(
                    reason.contains(&format!("over the limit of {MAX_ID_BYTES} bytes")),
                    "{reason}"
                );
            }
        } else {
            assert_eq!(result.as_ref().unwrap(), &(n as u32 * 2), "{id}");
        }
    }
    assert_eq!(count(&key, "double"), 50);

    // The other ways an id reaches keiro refuse it the same way.
    let enqueued = doubled(key.clone(), 1)
        .id(long_id.clone())
        .on(&keiro)
        .enqueue()
        .await;
    assert!(
        matches!(enqueued, Err(Error::InvalidId { .. })),
        "{enqueued:?}"
    );
    let handle = keiro.handle::<u32>(nul_id.clone()).await;
    assert!(matches!(handle, Err(Error::InvalidId { .. })), "{handle:?}");
    let cancelled = keiro.cancel(&nul_id).await;
    assert!(
        matches!(cancelled, Err(Error::InvalidId { .. })),
        "{cancelled:?}"
    );
    keiro.shutdown().await.unwrap();
}

async fn a_step_returning_nan_fails_the_workflow_naming_the_step(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let id = format!("order-{key}");

    let error = nan_checkout(key.clone())
        .id(&id)
        .on(&keiro)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "step `charge` (#1) of workflow `nan_checkout` id `{id}` returned NaN at `.total`"
        )) && text.contains("JSON cannot store"),
        "{text}"
    );
    // A bug in the code fails the workflow at once: no attempt would do better.
    assert_eq!(count(&key, "charge"), 1);
    let handle = keiro.handle::<f64>(&id).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Failed);

    // The step before it is journaled; nothing (no `null`) for the NaN.
    let store = store_of(&db).await;
    let journal = store.load_journal(&id, 0).await.unwrap();
    let names: Vec<&str> = journal.iter().map(|row| row.name.as_str()).collect();
    assert_eq!(names, ["reserve"], "{journal:?}");
    assert!(journal.iter().all(|row| !row.result.contains("null")));
    store.close().await;
    keiro.shutdown().await.unwrap();
}

async fn a_workflow_returning_infinity_gives_its_caller_the_reason(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let id = format!("boundless-{key}");

    let error = boundless(key.clone()).id(&id).on(&keiro).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "workflow `boundless` id `{id}` returned infinity as its whole value"
        )),
        "{text}"
    );
    assert_eq!(count(&key, "boundless"), 1);

    // Failed, with the reason, never `Completed` with an unreadable output.
    let store = store_of(&db).await;
    let row = store.get_instance(&id).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "failed");
    assert_eq!(row.output, None);
    assert!(row.error.unwrap_or_default().contains("infinity"));
    store.close().await;
    // A later caller reads the same reason.
    let again = keiro.handle::<f64>(&id).await.unwrap().result().await;
    assert!(
        again.unwrap_err().to_string().contains("returned infinity"),
        "a stored failure names its reason"
    );
    keiro.shutdown().await.unwrap();
}

/// `[[[…]]]` nested `depth` levels deep, built without recursion.
fn nested(depth: usize) -> serde_json::Value {
    let mut value = serde_json::Value::Null;
    for _ in 0..depth {
        value = serde_json::Value::Array(vec![value]);
    }
    value
}

async fn input_nested_too_deep_is_refused_at_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = format!("deep-{}", uuid::Uuid::new_v4());

    let error = depth_of(nested(200))
        .id(&id)
        .on(&keiro)
        .start()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::NotJournalable { .. }), "{text}");
    assert!(
        text.contains(&format!("the arguments of workflow `depth_of` id `{id}`"))
            && text.contains("nested more than 120 levels"),
        "{text}"
    );
    // Nothing was recorded.
    let missing = keiro.handle::<u32>(&id).await;
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );

    // Within the limit it runs and replays as given.
    let shallow = depth_of(nested(100)).id(format!("{id}-ok")).on(&keiro);
    assert_eq!(shallow.await.unwrap(), 100);

    // An awakeable's answer is checked the same way, before anything is read.
    let answer = keiro.resolve_awakeable("some-workflow/0/1", f64::NAN).await;
    assert!(
        matches!(&answer, Err(Error::NotJournalable { reason, .. }) if reason.starts_with("NaN")),
        "{answer:?}"
    );
    keiro.shutdown().await.unwrap();
}
