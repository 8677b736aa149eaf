//! Conformance of the worker registry on both backends: which workflow names
//! a live resume worker serves, and which queues it claims from.

#[macro_use]
mod support;

use keiro_store::{now_us, ExecutorRow, Queued};
use support::TestDb;

conformance!(
    a_name_is_served_only_by_a_live_worker_that_registered_it,
    registering_again_replaces_the_names,
    giving_up_the_identity_drops_the_names,
    an_instance_on_a_queue_no_live_worker_declares_is_unserved,
    a_live_worker_declaring_a_queue_with_other_limits_is_found,
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
        .register_workflows("w-live", &["checkout", "refund"], &[])
        .await
        .unwrap();
    assert!(store.is_served("checkout", now - 10_000_000).await.unwrap());
    assert!(store.is_served("refund", now - 10_000_000).await.unwrap());
    assert!(!store.is_served("ship", now - 10_000_000).await.unwrap());

    // A worker whose heartbeat stopped serves nothing.
    executor(db, "w-dead", now - 60_000_000).await;
    store
        .register_workflows("w-dead", &["ship"], &[])
        .await
        .unwrap();
    assert!(!store.is_served("ship", now - 10_000_000).await.unwrap());

    // Names registered under an executor row that is gone serve nothing.
    store
        .register_workflows("w-gone", &["audit"], &[])
        .await
        .unwrap();
    assert!(!store.is_served("audit", 0).await.unwrap());
}

async fn registering_again_replaces_the_names(db: &TestDb) {
    let store = &db.store;
    executor(db, "w1", now_us()).await;
    store
        .register_workflows("w1", &["a", "b"], &[])
        .await
        .unwrap();
    store
        .register_workflows("w1", &["b", "c"], &[])
        .await
        .unwrap();
    let since = now_us() - 10_000_000;
    assert!(!store.is_served("a", since).await.unwrap());
    assert!(store.is_served("b", since).await.unwrap());
    assert!(store.is_served("c", since).await.unwrap());
    store.register_workflows("w1", &[], &[]).await.unwrap();
    assert!(!store.is_served("b", since).await.unwrap());
}

async fn giving_up_the_identity_drops_the_names(db: &TestDb) {
    let store = &db.store;
    executor(db, "w1", now_us()).await;
    store.register_workflows("w1", &["a"], &[]).await.unwrap();
    assert!(store
        .remove_executor("w1", "token-w1")
        .await
        .unwrap()
        .is_some());
    // A process taking the identity anew serves nothing until it registers.
    executor(db, "w1", now_us()).await;
    assert!(!store.is_served("a", 0).await.unwrap());
}

async fn enqueue(db: &TestDb, id: &str, queue: Option<&str>) {
    let new = support::pending(id, "checkout");
    let queued = Queued {
        queue,
        priority: 0,
        partition: "",
        dedup: None,
        not_before: None,
    };
    let (_, created) = db.store.create_queued(&new, &queued).await.unwrap();
    assert!(created, "{id} is new");
}

async fn an_instance_on_a_queue_no_live_worker_declares_is_unserved(db: &TestDb) {
    let store = &db.store;
    let now = now_us();
    let since = now - 10_000_000;
    enqueue(db, "on-emails", Some("emails")).await;
    enqueue(db, "on-default", None).await;
    let unserved = |id: &'static str| async move { store.queue_unserved(id, since).await.unwrap() };
    assert_eq!(unserved("on-emails").await.as_deref(), Some("emails"));
    assert_eq!(unserved("on-default").await, None);
    assert_eq!(unserved("no-such-instance").await, None);

    // Declared by a worker whose heartbeat stopped: still unserved.
    executor(db, "w-dead", now - 60_000_000).await;
    store
        .register_workflows("w-dead", &["checkout"], &[("emails", "no limits")])
        .await
        .unwrap();
    assert_eq!(unserved("on-emails").await.as_deref(), Some("emails"));

    // A live worker declaring another queue does not serve it either.
    executor(db, "w-live", now).await;
    store
        .register_workflows("w-live", &["checkout"], &[("payments", "no limits")])
        .await
        .unwrap();
    assert_eq!(unserved("on-emails").await.as_deref(), Some("emails"));
    store
        .register_workflows(
            "w-live",
            &["checkout"],
            &[("payments", "no limits"), ("emails", "no limits")],
        )
        .await
        .unwrap();
    assert_eq!(unserved("on-emails").await, None);

    // Giving up the identity drops its queues.
    assert!(store
        .remove_executor("w-live", "token-w-live")
        .await
        .unwrap()
        .is_some());
    executor(db, "w-live", now_us()).await;
    assert_eq!(unserved("on-emails").await.as_deref(), Some("emails"));

    // A worker declaring the queue but not serving the workflow runs none.
    executor(db, "w-other", now).await;
    let other = [("", "default queue"), ("emails", "no limits")];
    store
        .register_workflows("w-other", &["refund"], &other)
        .await
        .unwrap();
    assert_eq!(unserved("on-emails").await.as_deref(), Some("emails"));

    // A live worker serving the workflow that registered no queue at all
    // runs a version from before queues were registered: it may serve it.
    executor(db, "w-old", now).await;
    store
        .register_workflows("w-old", &["checkout"], &[])
        .await
        .unwrap();
    assert_eq!(unserved("on-emails").await, None);
}

async fn a_live_worker_declaring_a_queue_with_other_limits_is_found(db: &TestDb) {
    let store = &db.store;
    let now = now_us();
    let since = now - 10_000_000;
    executor(db, "me", now).await;
    let mine = [("emails", "concurrency 10"), ("payments", "no limits")];
    store.register_workflows("me", &[], &mine).await.unwrap();
    assert_eq!(store.queue_limits_elsewhere("me", since).await.unwrap(), []);

    executor(db, "same", now).await;
    store.register_workflows("same", &[], &mine).await.unwrap();
    executor(db, "older", now).await;
    let older = [("emails", "concurrency 20"), ("reports", "no limits")];
    store
        .register_workflows("older", &[], &older)
        .await
        .unwrap();
    executor(db, "gone", now - 60_000_000).await;
    let gone = [("payments", "concurrency 1")];
    store.register_workflows("gone", &[], &gone).await.unwrap();

    let found = store.queue_limits_elsewhere("me", since).await.unwrap();
    assert_eq!(
        found,
        [keiro_store::OtherQueueLimits {
            queue: "emails".into(),
            executor_id: "older".into(),
            limits: "concurrency 20".into(),
        }]
    );
}
