//! Conformance of the outbox, on both backends: a message, a new instance or
//! an awaitable's resolution written in the caller's transaction exists
//! exactly when that transaction commits.

#[macro_use]
mod support;

use keiro_store::{
    create_instance_tx, resolve_tx, send_message_tx, InstanceStatus, Lease, NewInstance,
    NewMessage, Resolution, SendOutcome, StepRow, Store, Suspend,
};
use support::TestDb;

conformance!(
    a_message_is_sent_only_when_the_callers_transaction_commits,
    an_instance_exists_only_when_the_callers_transaction_commits,
    a_resolution_is_recorded_only_when_the_callers_transaction_commits,
);

/// Runs `$body` with `$tx`, a transaction of `$store`'s own pool, then
/// commits it when `$commit`, else rolls it back; yields the body's value.
macro_rules! in_tx {
    ($store:expr, $commit:expr, |$tx:ident| $body:expr) => {
        match $store {
            Store::Sqlite(s) => {
                let mut $tx = s.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
                let out = $body;
                if $commit {
                    $tx.commit().await.unwrap();
                } else {
                    $tx.rollback().await.unwrap();
                }
                out
            }
            Store::Postgres(p) => {
                let mut $tx = p.pool().begin().await.unwrap();
                let out = $body;
                if $commit {
                    $tx.commit().await.unwrap();
                } else {
                    $tx.rollback().await.unwrap();
                }
                out
            }
        }
    };
}

fn instance<'a>(id: &'a str, lease: Option<Lease<'a>>) -> NewInstance<'a> {
    NewInstance {
        lease,
        ..NewInstance::new(id, "flow", "[]")
    }
}

const LEASE: Lease<'static> = Lease {
    owner: "w1",
    ttl_us: 60_000_000,
};

async fn a_message_is_sent_only_when_the_callers_transaction_commits(db: &TestDb) {
    assert!(
        db.store
            .create_instance(&instance("rx", Some(LEASE)))
            .await
            .unwrap()
            .1
    );
    // Suspended for the topic: the send makes it due at the time the caller
    // gives (its runtime's clock, maybe a test's virtual one).
    assert!(db
        .store
        .suspend_for_message(
            &Suspend {
                id: "rx",
                generation: 0,
                owner: "w1",
                wake_at: None,
                awaiting: None,
                waiting: None,
            },
            "t",
        )
        .await
        .unwrap());
    let then = db.store.now_us() - 3_600_000_000;
    let message = NewMessage {
        workflow_id: "rx",
        topic: "t",
        payload: "1",
        type_name: Some("u32"),
        idempotency_key: None,
        journal: None,
    };
    let sent = in_tx!(&db.store, false, |tx| send_message_tx(
        &mut tx,
        &message,
        db.store.now_us()
    )
    .await
    .unwrap());
    assert!(matches!(sent, SendOutcome::Sent(_)), "{sent:?}");
    assert_eq!(db.store.count_waiting_messages("rx", "t").await.unwrap(), 0);
    let sent = in_tx!(&db.store, true, |tx| send_message_tx(
        &mut tx, &message, then
    )
    .await
    .unwrap());
    assert!(matches!(sent, SendOutcome::Sent(_)), "{sent:?}");
    assert_eq!(db.store.count_waiting_messages("rx", "t").await.unwrap(), 1);
    let rx = db.store.get_instance("rx").await.unwrap().unwrap();
    assert_eq!(rx.wake_at, Some(then), "due at the caller's time");
    let missing = NewMessage {
        workflow_id: "nobody",
        ..message
    };
    let refused = in_tx!(&db.store, true, |tx| send_message_tx(
        &mut tx,
        &missing,
        db.store.now_us()
    )
    .await
    .unwrap());
    assert_eq!(refused, SendOutcome::NotFound);
}

async fn an_instance_exists_only_when_the_callers_transaction_commits(db: &TestDb) {
    let now = db.store.now_us();
    let (row, created) = in_tx!(&db.store, false, |tx| create_instance_tx(
        &mut tx,
        &instance("queued", None),
        now
    )
    .await
    .unwrap());
    assert!(created);
    assert_eq!(row.status, InstanceStatus::Pending);
    assert_eq!(db.store.get_instance("queued").await.unwrap(), None);
    // Created at the time the caller gives (its clock may be a test's).
    let then = 978_307_200_000_000; // 2001-01-01
    let (_, created) = in_tx!(&db.store, true, |tx| {
        let first = create_instance_tx(&mut tx, &instance("queued", None), then)
            .await
            .unwrap();
        let again = create_instance_tx(&mut tx, &instance("queued", None), now)
            .await
            .unwrap();
        assert!(!again.1, "the second create reads the first");
        first
    });
    assert!(created);
    let row = db.store.get_instance("queued").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Pending);
    assert_eq!(row.created_at, then);
}

async fn a_resolution_is_recorded_only_when_the_callers_transaction_commits(db: &TestDb) {
    assert!(
        db.store
            .create_instance(&instance("waiter", Some(LEASE)))
            .await
            .unwrap()
            .1
    );
    let step = |seq: i64, kind: &str, result: &str| StepRow {
        workflow_id: "waiter".into(),
        generation: 0,
        seq,
        name: "awakeable".into(),
        kind: kind.into(),
        result: result.into(),
    };
    db.store
        .append_steps(&[step(0, "awakeable", "\"created\"")])
        .await
        .unwrap();
    // Suspended awaiting the answer: the answer makes it due at the time
    // the caller gives (its runtime's clock, maybe a test's virtual one).
    assert!(db
        .store
        .suspend(&Suspend {
            id: "waiter",
            generation: 0,
            owner: "w1",
            wake_at: None,
            awaiting: Some(1),
            waiting: None,
        })
        .await
        .unwrap());
    let then = db.store.now_us() - 3_600_000_000;
    let answer = step(1, "resolution", "{\"Ok\":true}");
    let resolution = in_tx!(&db.store, false, |tx| resolve_tx(
        &mut tx,
        0,
        "awakeable",
        &answer,
        then
    )
    .await
    .unwrap());
    assert_eq!(resolution, Resolution::Recorded);
    assert_eq!(db.store.get_step("waiter", 0, 1).await.unwrap(), None);
    let resolution = in_tx!(&db.store, true, |tx| resolve_tx(
        &mut tx,
        0,
        "awakeable",
        &answer,
        then
    )
    .await
    .unwrap());
    assert_eq!(resolution, Resolution::Recorded);
    assert_eq!(
        db.store.get_step("waiter", 0, 1).await.unwrap(),
        Some(answer.clone())
    );
    let waiter = db.store.get_instance("waiter").await.unwrap().unwrap();
    assert_eq!(waiter.wake_at, Some(then), "due at the caller's time");
    let again = in_tx!(&db.store, true, |tx| resolve_tx(
        &mut tx,
        0,
        "awakeable",
        &answer,
        then
    )
    .await
    .unwrap());
    assert!(matches!(again, Resolution::AlreadyResolved(_)), "{again:?}");
}
