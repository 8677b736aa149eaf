//! The operator's typed API, on both backends: `keiro.list` pages through
//! instances by filter (every row once, even while rows are added), refuses
//! bad cursors and limits, and `keiro.steps` shows an instance's journal.

use std::collections::HashSet;

use keiro::{step, workflow, Error, ListFilter, StepOutcome, WorkflowStatus};
use keiro_store::NewInstance;
use keiro_tests::{on_both_backends, Backend, TestDb};

/// Inserts `count` pending instances of `name` with ids `{prefix}{n}`.
async fn insert(store: &keiro_store::Store, name: &str, prefix: &str, range: std::ops::Range<u32>) {
    let ids: Vec<String> = range.map(|n| format!("{prefix}{n:05}")).collect();
    for chunk in ids.chunks(1000) {
        let news: Vec<NewInstance<'_>> = chunk
            .iter()
            .map(|id| NewInstance::new(id, name, "[]"))
            .collect();
        store.create_instances(&news).await.unwrap();
    }
}

async fn paging_visits_every_row_once_while_rows_are_added(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    insert(store, "bulk", "row-", 0..10_000).await;
    insert(store, "other", "x-", 0..50).await;
    for oldest_first in [false, true] {
        let mut filter = ListFilter::default().name("bulk").limit(700);
        if oldest_first {
            filter = filter.oldest_first();
        }
        let mut seen = HashSet::new();
        let mut pages = 0;
        let mut added = 0;
        loop {
            let page = keiro.list(&filter).await.unwrap();
            pages += 1;
            for item in &page.items {
                assert_eq!(item.name, "bulk");
                assert!(seen.insert(item.id.clone()), "{} listed twice", item.id);
            }
            // Rows added between pages must not make any row repeat or vanish.
            let start = 20_000 + added;
            insert(store, "bulk", "late-", start..start + 25).await;
            added += 25;
            match page.next_cursor {
                Some(cursor) => filter = filter.cursor(cursor),
                None => break,
            }
            assert!(pages < 100, "paging does not end");
        }
        let originals = (0..10_000)
            .filter(|n| seen.contains(&format!("row-{n:05}")))
            .count();
        assert_eq!(
            originals, 10_000,
            "oldest_first={oldest_first}: every row, once"
        );
    }
}

async fn filters_select_by_status_prefix_and_parent(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    insert(store, "alpha", "order-", 0..30).await;
    insert(store, "beta", "invoice-", 0..20).await;
    let done = three_steps(1).id("done-1").on(&keiro).await.unwrap();
    assert_eq!(done, Ok(6));
    let page = keiro
        .list(&ListFilter::default().id_prefix("order-").limit(1000))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 30);
    assert!(page.next_cursor.is_none());
    let page = keiro
        .list(&ListFilter::default().status(WorkflowStatus::Completed))
        .await
        .unwrap();
    let ids: Vec<&str> = page.items.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["done-1"]);
    let pending = keiro
        .list(
            &ListFilter::default()
                .status(WorkflowStatus::Pending)
                .name("beta")
                .limit(5),
        )
        .await
        .unwrap();
    assert_eq!(pending.items.len(), 5);
    assert!(pending
        .items
        .iter()
        .all(|s| s.status == WorkflowStatus::Pending));
    assert!(pending.next_cursor.is_some());
    // Newest first by default: ids were inserted in order.
    assert_eq!(pending.items[0].id, "invoice-00019");
}

async fn bad_cursors_and_limits_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    insert(store, "alpha", "a-", 0..5).await;
    for cursor in ["", "garbage", "n12.zz", "x1.61", "n1.6"] {
        let err = keiro
            .list(&ListFilter::default().cursor(cursor))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidCursor { .. }),
            "{cursor:?}: {err}"
        );
    }
    let page = keiro.list(&ListFilter::default().limit(2)).await.unwrap();
    let newest_cursor = page.next_cursor.unwrap();
    let err = keiro
        .list(&ListFilter::default().oldest_first().cursor(newest_cursor))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("other order"), "{err}");
    for limit in [0, 1001] {
        let err = keiro
            .list(&ListFilter::default().limit(limit))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
    }
}

#[step]
async fn add(a: u32, b: u32) -> u32 {
    a + b
}

#[step]
async fn refuse(n: u32) -> Result<u32, String> {
    Err(format!("no {n}"))
}

/// Three journaled entries and a step error it tolerates; returns 6.
#[workflow]
async fn three_steps(n: u32) -> Result<u32, String> {
    let two = add(n, 1).await;
    let _ = refuse(n).await;
    keiro::sleep(std::time::Duration::from_millis(1)).await;
    Ok(add(two, 4).await)
}

async fn steps_show_the_journal_in_order(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    three_steps(1)
        .id("journaled")
        .on(&keiro)
        .await
        .unwrap()
        .unwrap();
    let steps = keiro.steps("journaled").await.unwrap();
    let shape: Vec<(i64, &str, &str, StepOutcome)> = steps
        .iter()
        .map(|s| (s.seq, s.kind.as_str(), s.name.as_str(), s.outcome))
        .collect();
    assert_eq!(
        shape,
        [
            (0, "step", "add", StepOutcome::Ok),
            (1, "step", "refuse", StepOutcome::Err),
            (2, "sleep", "sleep", StepOutcome::Ok),
            (3, "step", "add", StepOutcome::Ok),
        ]
    );
    assert_eq!(steps[0].value, serde_json::json!(2));
    assert_eq!(steps[1].value, serde_json::json!("no 1"));
    let err = keiro.steps("nobody").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
}

on_both_backends!(
    paging_visits_every_row_once_while_rows_are_added,
    filters_select_by_status_prefix_and_parent,
    bad_cursors_and_limits_are_refused,
    steps_show_the_journal_in_order,
);
