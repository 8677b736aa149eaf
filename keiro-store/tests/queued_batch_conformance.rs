//! Enqueues on named queues recorded together (`Store::create_queued_many`,
//! and the writer's rounds of `JournalWriter::create_queued`), on both
//! backends: each instance lands on its queue as a lone enqueue puts it, an
//! id taken already is left where it is, and a refused dedup key fails the
//! batch whole (the writer then refuses that enqueue alone).

#[macro_use]
mod support;

use keiro_store::{
    CreateRequest, JournalWriter, NewInstance, QueueLimits, Queued, QueuedRequest, Registered,
    Store, StoreError,
};
use support::{lease, TestDb};

const FLOW: Registered<'static> = Registered {
    name: "flow",
    signature: "sig",
};

/// Instance `id` of [`FLOW`].
fn instance(id: &str) -> NewInstance<'_> {
    NewInstance {
        signature: Some(FLOW.signature),
        ..NewInstance::new(id, FLOW.name, "[]")
    }
}

/// A place on queue `queue`, priority 0, no partition, key or delay.
fn on(queue: &str) -> Queued<'_> {
    Queued {
        queue: Some(queue),
        priority: 0,
        partition: "",
        dedup: None,
        not_before: None,
    }
}

/// The ids claims of queue `queue` start one at a time until it has none
/// due: its instances in run order.
async fn claim(store: &Store, queue: &str) -> Vec<String> {
    claim_within(store, queue, 10).await
}

/// [`claim`] with at most `concurrency` running per partition.
async fn claim_within(store: &Store, queue: &str, concurrency: i64) -> Vec<String> {
    let limits = QueueLimits {
        name: queue,
        concurrency: Some(concurrency),
        worker_concurrency: None,
        rate_limit: None,
    };
    let mut ids = Vec::new();
    loop {
        let rows = store
            .claim_queue(lease(), &[FLOW], &[], &limits, 1)
            .await
            .unwrap();
        let [row] = rows.as_slice() else {
            assert!(rows.is_empty(), "a claim of one took {}", rows.len());
            return ids;
        };
        ids.push(row.id.clone());
    }
}

/// Whether instance `id` exists.
async fn exists(store: &Store, id: &str) -> bool {
    store.get_instance(id).await.unwrap().is_some()
}

/// Each member of a batch lands on its own queue with its priority, its
/// delay and its dedup key, as a lone enqueue puts it.
async fn a_batch_puts_each_instance_on_its_queue(db: &TestDb) {
    let later = db.store.now_us() + 3_600_000_000;
    let batch = [
        (
            instance("a-low"),
            Queued {
                priority: 5,
                ..on("a")
            },
        ),
        (
            instance("b-one"),
            Queued {
                dedup: Some("k"),
                ..on("b")
            },
        ),
        (
            instance("a-high"),
            Queued {
                priority: 1,
                ..on("a")
            },
        ),
        (
            instance("a-later"),
            Queued {
                not_before: Some(later),
                ..on("a")
            },
        ),
        (
            instance("default-later"),
            Queued {
                queue: None,
                not_before: Some(later),
                ..on("a")
            },
        ),
    ];
    let created = db.store.create_queued_many(&batch).await.unwrap();
    let ids: Vec<(&str, bool)> = created.iter().map(|(r, c)| (r.id.as_str(), *c)).collect();
    assert_eq!(
        ids,
        [
            ("a-low", true),
            ("b-one", true),
            ("a-high", true),
            ("a-later", true),
            ("default-later", true)
        ]
    );
    assert_eq!(created[3].0.wake_at, Some(later), "the delay is in the row");
    // And in the stored rows, on a named queue and on the default one.
    for id in ["a-later", "default-later"] {
        let stored = db.store.get_instance(id).await.unwrap().unwrap();
        assert_eq!(stored.wake_at, Some(later), "{id}'s delay is stored");
    }
    // Nothing of them on the default queue.
    let due = db.store.claim_due(lease(), &[FLOW], &[], 10).await.unwrap();
    assert!(due.is_empty(), "{due:?}");
    assert_eq!(claim(&db.store, "a").await, ["a-high", "a-low"]);
    assert_eq!(claim(&db.store, "b").await, ["b-one"]);
    // `b-one` holds key `k` of queue `b`.
    let refused = db
        .store
        .create_queued(
            &instance("b-two"),
            &Queued {
                dedup: Some("k"),
                ..on("b")
            },
        )
        .await
        .unwrap_err();
    match refused {
        StoreError::Duplicate {
            queue,
            key,
            existing_id,
        } => assert_eq!(
            (queue.as_str(), key.as_str(), existing_id.as_str()),
            ("b", "k", "b-one")
        ),
        other => panic!("expected a duplicate, got {other}"),
    }
}

/// A member with a partition key lands in that partition, whose limit is
/// its own: with one running per partition, its claim does not take the
/// slot of the queue's shared partition, nor the other way round.
async fn a_batch_puts_each_instance_in_its_partition(db: &TestDb) {
    let batch = [
        (
            instance("shared-first"),
            Queued {
                priority: 1,
                ..on("a")
            },
        ),
        (
            instance("own"),
            Queued {
                partition: "customer-7",
                ..on("a")
            },
        ),
        (
            instance("shared-second"),
            Queued {
                priority: 2,
                ..on("a")
            },
        ),
    ];
    db.store.create_queued_many(&batch).await.unwrap();
    // `own` first (priority 0), then the shared partition's first; its
    // second waits for the shared slot.
    assert_eq!(
        claim_within(&db.store, "a", 1).await,
        ["own", "shared-first"]
    );
}

/// An id recorded before is returned as it is (`false`), and stays where
/// it was: it is not moved onto the batch's queue.
async fn an_id_taken_already_stays_where_it_is(db: &TestDb) {
    db.store.create_instance(&instance("old")).await.unwrap();
    let batch = [(instance("old"), on("a")), (instance("new"), on("a"))];
    let created = db.store.create_queued_many(&batch).await.unwrap();
    assert_eq!((created[0].0.id.as_str(), created[0].1), ("old", false));
    assert_eq!((created[1].0.id.as_str(), created[1].1), ("new", true));
    assert_eq!(claim(&db.store, "a").await, ["new"]);
    let due = db.store.claim_due(lease(), &[FLOW], &[], 10).await.unwrap();
    let due: Vec<&str> = due.iter().map(|row| row.id.as_str()).collect();
    assert_eq!(due, ["old"], "still on the default queue");
}

/// Two members with one queue's dedup key, or one whose key an unfinished
/// instance holds, fail the batch whole: nothing of it is written.
async fn a_refused_dedup_key_fails_the_batch_whole(db: &TestDb) {
    let keyed = |id| {
        (
            instance(id),
            Queued {
                dedup: Some("k"),
                ..on("q")
            },
        )
    };
    let twice = [keyed("x"), (instance("y"), on("q")), keyed("z")];
    db.store.create_queued_many(&twice).await.unwrap_err();
    for id in ["x", "y", "z"] {
        assert!(!exists(&db.store, id).await, "{id} was not written");
    }
    db.store
        .create_queued(&instance("holder"), &keyed("holder").1)
        .await
        .unwrap();
    let behind = [(instance("y"), on("q")), keyed("x")];
    match db.store.create_queued_many(&behind).await.unwrap_err() {
        StoreError::Duplicate { existing_id, .. } => assert_eq!(existing_id, "holder"),
        other => panic!("expected a duplicate, got {other}"),
    }
    for id in ["x", "y"] {
        assert!(!exists(&db.store, id).await, "{id} was not written");
    }
}

/// Runs `$body` inside `$tx`, a transaction of `$store`'s own pool taking
/// the write lock (SQLite) at once, then commits it.
macro_rules! committed {
    ($store:expr, |$tx:ident| $body:expr) => {
        match $store {
            Store::Sqlite(s) => {
                let mut $tx = s.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
                let out = $body;
                $tx.commit().await.unwrap();
                out
            }
            Store::Postgres(p) => {
                let mut $tx = p.pool().begin().await.unwrap();
                let out = $body;
                $tx.commit().await.unwrap();
                out
            }
        }
    };
}

/// A lone enqueue that meets its dedup key taken by a transaction still
/// open (PostgreSQL: after the enqueue's own check, so it waits on the key
/// and then meets the unique index; SQLite: it waits for the write lock)
/// is refused with `Duplicate` naming the holder, not with the database's
/// error.
async fn a_key_taken_while_the_enqueue_waits_is_a_duplicate(db: &TestDb) {
    let store = db.store.clone();
    let waiting = committed!(&db.store, |tx| {
        keyed_create(&mut tx, "holder").await;
        let contender = tokio::spawn(async move {
            let keyed = Queued {
                dedup: Some("k"),
                ..on("q")
            };
            store.create_queued(&instance("late"), &keyed).await
        });
        // Long enough for the contender to reach the key (or the lock).
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        contender
    });
    match waiting.await.expect("the enqueue task panicked") {
        Err(StoreError::Duplicate { existing_id, .. }) => assert_eq!(existing_id, "holder"),
        other => panic!("expected a duplicate of `holder`, got {other:?}"),
    }
    assert!(!exists(&db.store, "late").await);
}

/// Enqueues `id` on queue `q` with dedup key `k` inside `tx`.
async fn keyed_create<'t, 'c: 't>(tx: impl Into<keiro_store::TimerTx<'t, 'c>>, id: &str) {
    let keyed = Queued {
        dedup: Some("k"),
        ..on("q")
    };
    let clock = keiro_store::Clock::system();
    let (_, created) = keiro_store::create_queued_tx(tx, &instance(id), &keyed, &clock)
        .await
        .unwrap();
    assert!(created);
}

/// A dedup key needs a named queue (the default queue keeps no keys): each
/// way of enqueueing refuses one without, naming the key, and writes
/// nothing, where before a second such enqueue was silently accepted.
async fn a_dedup_key_on_the_default_queue_is_refused(db: &TestDb) {
    let keyed = Queued {
        queue: None,
        dedup: Some("order-7"),
        ..on("q")
    };
    let refused = |error: StoreError| {
        let text = error.to_string();
        assert!(
            matches!(
                error,
                StoreError::InvalidId {
                    what: "dedup key",
                    ..
                }
            ) && text.contains("order-7")
                && text.contains("named queue"),
            "{text}"
        );
    };
    refused(
        db.store
            .create_queued(&instance("a"), &keyed)
            .await
            .unwrap_err(),
    );
    let batch = [(instance("b"), on("q")), (instance("c"), keyed)];
    refused(db.store.create_queued_many(&batch).await.unwrap_err());
    let clock = keiro_store::Clock::system();
    let in_tx = committed!(&db.store, |tx| {
        keiro_store::create_queued_tx(&mut tx, &instance("d"), &keyed, &clock).await
    });
    refused(in_tx.unwrap_err());
    for id in ["a", "b", "c", "d"] {
        assert!(!exists(&db.store, id).await, "{id} was not written");
    }
}

conformance!(
    a_dedup_key_on_the_default_queue_is_refused,
    a_key_taken_while_the_enqueue_waits_is_a_duplicate,
    a_batch_puts_each_instance_on_its_queue,
    a_batch_puts_each_instance_in_its_partition,
    an_id_taken_already_stays_where_it_is,
    a_refused_dedup_key_fails_the_batch_whole,
);

/// Enqueues sharing a writer round: every one lands on its queue, and of
/// two with one dedup key only the second is refused, naming the first.
async fn the_writer_refuses_only_the_duplicate(db: &TestDb) {
    let writer = JournalWriter::spawn(db.store.clone());
    // Queued before the writer task runs (current-thread runtime): one round.
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let writer = writer.clone();
            let queued = QueuedRequest {
                queue: Some("q".into()),
                dedup: matches!(i, 1 | 4).then(|| "k".to_owned()),
                ..QueuedRequest::default()
            };
            let request = CreateRequest {
                signature: Some(FLOW.signature.into()),
                ..CreateRequest::new(format!("w-{i}"), FLOW.name, "[]")
            };
            tokio::spawn(async move { writer.create_queued(request, queued).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let outcome = task.await.expect("an enqueue task panicked");
        match (i, outcome) {
            (4, Err(StoreError::Duplicate { existing_id, .. })) => assert_eq!(existing_id, "w-1"),
            (4, other) => panic!("w-4 shares w-1's key: expected a duplicate, got {other:?}"),
            (_, Ok((row, created))) => assert!(created, "{} is new", row.id),
            (_, Err(error)) => panic!("w-{i}: {error}"),
        }
    }
    assert_eq!(
        claim(&db.store, "q").await,
        ["w-0", "w-1", "w-2", "w-3", "w-5"]
    );
}

#[tokio::test]
async fn sqlite_the_writer_refuses_only_the_duplicate() {
    let db = TestDb::sqlite().await;
    the_writer_refuses_only_the_duplicate(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn postgres_the_writer_refuses_only_the_duplicate() {
    let db = TestDb::postgres().await;
    the_writer_refuses_only_the_duplicate(&db).await;
    db.finish().await;
}

#[tokio::test]
async fn pgbouncer_the_writer_refuses_only_the_duplicate() {
    let db = TestDb::pgbouncer().await;
    the_writer_refuses_only_the_duplicate(&db).await;
    db.finish().await;
}

/// PostgreSQL: an enqueue in a REPEATABLE READ transaction whose snapshot
/// predates another enqueue's commit of the same dedup key cannot see the
/// holder to name it: it is refused as a conflict with a concurrent
/// transaction (which running the transaction again gets past, and then
/// names the holder), not with the unique index's raw error.
#[tokio::test]
async fn postgres_an_enqueue_behind_its_snapshot_meets_a_conflict() {
    let db = TestDb::postgres().await;
    let Store::Postgres(pg) = &db.store else {
        unreachable!("a PostgreSQL store");
    };
    let mut tx = pg.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The snapshot is taken by the transaction's first read.
    sqlx::query("SELECT count(*) FROM keiro.workflows")
        .execute(&mut *tx)
        .await
        .unwrap();
    let keyed = Queued {
        dedup: Some("k"),
        ..on("q")
    };
    db.store
        .create_queued(&instance("holder"), &keyed)
        .await
        .unwrap();
    let clock = keiro_store::Clock::system();
    let behind = keiro_store::create_queued_tx(&mut tx, &instance("late"), &keyed, &clock).await;
    match behind {
        Err(StoreError::Conflict { step, reason }) => {
            assert_eq!(step, "enqueue_tx");
            assert!(
                reason.contains("`k`") && reason.contains("again"),
                "{reason}"
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    // Run again, the enqueue sees the holder and names it.
    let mut tx = pg.pool().begin().await.unwrap();
    match keiro_store::create_queued_tx(&mut tx, &instance("late"), &keyed, &clock).await {
        Err(StoreError::Duplicate { existing_id, .. }) => assert_eq!(existing_id, "holder"),
        other => panic!("expected a duplicate of `holder`, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    db.finish().await;
}
