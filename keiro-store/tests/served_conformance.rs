//! Conformance of the worker registry on both backends: which workflow names
//! a live resume worker serves.

#[macro_use]
mod support;

use keiro_store::{now_us, ExecutorRow};
use support::TestDb;

conformance!(
    a_name_is_served_only_by_a_live_worker_that_registered_it,
    registering_again_replaces_the_names,
    giving_up_the_identity_drops_the_names,
);

async fn executor(db: &TestDb, id: &str, heartbeat_at: i64) {
    let row = ExecutorRow {
        id: id.to_owned(),
        token: format!("token-{id}"),
        host: "host".to_owned(),
        pid: 1,
        heartbeat_at,
    };
    assert!(db.store.put_executor(&row, None).await.unwrap());
}

async fn a_name_is_served_only_by_a_live_worker_that_registered_it(db: &TestDb) {
    let store = &db.store;
    let now = now_us();
    assert!(!store.is_served("checkout", now - 10_000_000).await.unwrap());

    executor(db, "w-live", now).await;
    store
        .register_workflows("w-live", &["checkout", "refund"])
        .await
        .unwrap();
    assert!(store.is_served("checkout", now - 10_000_000).await.unwrap());
    assert!(store.is_served("refund", now - 10_000_000).await.unwrap());
    assert!(!store.is_served("ship", now - 10_000_000).await.unwrap());

    // A worker whose heartbeat stopped serves nothing.
    executor(db, "w-dead", now - 60_000_000).await;
    store.register_workflows("w-dead", &["ship"]).await.unwrap();
    assert!(!store.is_served("ship", now - 10_000_000).await.unwrap());

    // Names registered under an executor row that is gone serve nothing.
    store
        .register_workflows("w-gone", &["audit"])
        .await
        .unwrap();
    assert!(!store.is_served("audit", 0).await.unwrap());
}

async fn registering_again_replaces_the_names(db: &TestDb) {
    let store = &db.store;
    executor(db, "w1", now_us()).await;
    store.register_workflows("w1", &["a", "b"]).await.unwrap();
    store.register_workflows("w1", &["b", "c"]).await.unwrap();
    let since = now_us() - 10_000_000;
    assert!(!store.is_served("a", since).await.unwrap());
    assert!(store.is_served("b", since).await.unwrap());
    assert!(store.is_served("c", since).await.unwrap());
    store.register_workflows("w1", &[]).await.unwrap();
    assert!(!store.is_served("b", since).await.unwrap());
}

async fn giving_up_the_identity_drops_the_names(db: &TestDb) {
    let store = &db.store;
    executor(db, "w1", now_us()).await;
    store.register_workflows("w1", &["a"]).await.unwrap();
    assert!(store
        .remove_executor("w1", "token-w1")
        .await
        .unwrap()
        .is_some());
    // A process taking the identity anew serves nothing until it registers.
    executor(db, "w1", now_us()).await;
    assert!(!store.is_served("a", 0).await.unwrap());
}
