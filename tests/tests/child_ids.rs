//! A child's identity includes its parent link, on both backends: an
//! instance that already holds a child's id but is not that parent's child is
//! an `Error::IdConflict` for the parent's child call (never a hang, never a
//! shared result), and an outside call with a child's id and other arguments
//! is refused the same way.

use std::time::Duration;

use keiro::{workflow, Error, Keiro};
use keiro_tests::{on_both_backends, Backend, TestDb};

/// A child that adds one.
#[workflow]
async fn leaf(n: u64) -> u64 {
    n + 1
}

/// Calls `leaf(n)` as its first child (id `<parent id>/0`) and reports what
/// the call gave: the child's output, or the error it got.
#[workflow]
async fn first_child_parent(n: u64) -> Result<u64, String> {
    match leaf(n).await {
        Ok(out) => Ok(out),
        Err(error @ Error::IdConflict { .. }) => Err(format!("conflict: {error}")),
        Err(error) => Err(format!("other error: {error}")),
    }
}

/// Each generation calls `leaf` as its first child, then continues as new
/// until `left` is 0; returns the sum of what its children gave.
#[workflow]
async fn generations_with_children(left: u64, sum: u64) -> Result<u64, String> {
    let got = leaf(left).await.map_err(|e| e.to_string())?;
    if left == 0 {
        return Ok(sum + got);
    }
    keiro::continue_as_new(generations_with_children(left - 1, sum + got))
        .await
        .map_err(|e| e.to_string())
}

async fn runtime(db: &TestDb) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(format!("cid-{}", uuid::Uuid::new_v4().simple()))
        .suspend_after(Duration::from_millis(200))
        .connect()
        .await
        .unwrap()
}

/// Runs the parent `parent` calling `leaf(n)`, bounded in time: a hang is a
/// failure, not a stuck test.
async fn run_parent(keiro: &Keiro, parent: &str, n: u64) -> Result<u64, String> {
    let call = first_child_parent(n).id(parent).on(keiro);
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .unwrap_or_else(|_| panic!("parent {parent} hung on its first child"))
        .unwrap()
}

/// The parent's call of `leaf` got an IdConflict naming the child id and
/// saying who holds it.
fn assert_conflict(out: &Result<u64, String>, child: &str) {
    let text = out.as_ref().expect_err("the child call must be refused");
    assert!(
        text.starts_with("conflict: ")
            && text.contains(&format!("`{child}`"))
            && text.contains("outside any workflow"),
        "{text}"
    );
}

async fn a_completed_outside_instance_with_the_childs_id_is_a_conflict(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    // Other arguments, and the very same arguments: neither is this parent's child.
    for n in [99, 7] {
        let parent = format!("P-{}", uuid::Uuid::new_v4().simple());
        let child = format!("{parent}/0");
        assert_eq!(leaf(n).id(&child).on(&keiro).await.unwrap(), n + 1);
        let out = run_parent(&keiro, &parent, 7).await;
        assert_conflict(&out, &child);
        // The outside instance is untouched and still answers its own caller.
        let row = keiro.store().get_instance(&child).await.unwrap().unwrap();
        assert_eq!(row.parent_id, None);
        assert_eq!(leaf(n).id(&child).on(&keiro).await.unwrap(), n + 1);
    }
}

async fn an_enqueued_outside_instance_with_the_childs_id_is_a_conflict(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    for n in [99, 7] {
        let parent = format!("P-{}", uuid::Uuid::new_v4().simple());
        let child = format!("{parent}/0");
        leaf(n).id(&child).on(&keiro).enqueue().await.unwrap();
        let out = run_parent(&keiro, &parent, 7).await;
        assert_conflict(&out, &child);
        let row = keiro.store().get_instance(&child).await.unwrap().unwrap();
        assert_eq!(row.parent_id, None);
        // Still its own caller's: whoever runs it gets its own result.
        assert_eq!(leaf(n).id(&child).on(&keiro).await.unwrap(), n + 1);
    }
}

async fn an_outside_call_of_a_childs_id_with_other_arguments_is_a_conflict(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let parent = format!("P-{}", uuid::Uuid::new_v4().simple());
    let child = format!("{parent}/0");
    assert_eq!(run_parent(&keiro, &parent, 7).await, Ok(8));
    let err = leaf(99).id(&child).on(&keiro).await.unwrap_err();
    assert!(matches!(err, Error::IdConflict { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("`{child}`"))
            && text.contains(&format!("child at step 0 of workflow instance `{parent}`")),
        "{text}"
    );
    for err in [
        leaf(99).id(&child).on(&keiro).start().await.unwrap_err(),
        leaf(99).id(&child).on(&keiro).enqueue().await.unwrap_err(),
    ] {
        assert!(matches!(err, Error::IdConflict { .. }), "{err}");
    }
    // The same call from outside is the same call: it reads the child's
    // result like `keiro::handle` would (the rule for any reused id).
    assert_eq!(leaf(7).id(&child).on(&keiro).await.unwrap(), 8);
    // And the parent, replayed, still has its own child's result.
    assert_eq!(run_parent(&keiro, &parent, 7).await, Ok(8));
}

/// A generation after continue-as-new gets children of its own: the same
/// step position in a later generation is another default child id, never
/// the earlier generation's child (whose result is not this call's).
async fn each_generation_after_continue_as_new_has_its_own_children(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let parent = format!("G-{}", uuid::Uuid::new_v4().simple());
    let call = generations_with_children(2, 0).id(&parent).on(&keiro);
    let out = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the generations end in time")
        .unwrap();
    // leaf(2) + leaf(1) + leaf(0) = 3 + 2 + 1.
    assert_eq!(out, Ok(6));
    for (child, input) in [
        (format!("{parent}/0"), 2u64),
        (format!("{parent}/1.0"), 1),
        (format!("{parent}/2.0"), 0),
    ] {
        let row = keiro.store().get_instance(&child).await.unwrap();
        let row = row.unwrap_or_else(|| panic!("child {child} was created"));
        assert_eq!(row.parent_id.as_deref(), Some(parent.as_str()));
        assert_eq!(row.input, serde_json::json!([input]).to_string(), "{child}");
    }
}

on_both_backends!(
    each_generation_after_continue_as_new_has_its_own_children,
    a_completed_outside_instance_with_the_childs_id_is_a_conflict,
    an_enqueued_outside_instance_with_the_childs_id_is_a_conflict,
    an_outside_call_of_a_childs_id_with_other_arguments_is_a_conflict,
);
