//! Conformance of executor identities, on both backends: the numbered default
//! identities of one program are read together, and giving up an identity
//! releases its leases in the same transaction; a worker reads the database
//! server's clock to learn whether its own is off.

#[macro_use]
mod support;

use keiro_store::{now_us, ExecutorRow, InstanceStatus, Lease, NewInstance};
use support::TestDb;

conformance!(
    list_executors_reads_a_base_and_its_numbered_slots_only,
    remove_executor_releases_the_leases_it_held,
    remove_executor_with_a_stale_token_changes_nothing,
    the_server_clock_is_read_where_the_database_has_one,
);

fn executor(id: &str, token: &str) -> ExecutorRow {
    ExecutorRow {
        id: id.to_owned(),
        token: token.to_owned(),
        host: "h".to_owned(),
        pid: 1,
        heartbeat_at: now_us(),
    }
}

async fn register(db: &TestDb, id: &str, token: &str) {
    assert!(db
        .store
        .put_executor(&executor(id, token), None)
        .await
        .unwrap());
}

async fn leased(db: &TestDb, id: &str, owner: &str) {
    let new = NewInstance {
        id,
        name: "checkout",
        input: "{}",
        signature: None,
        parent: None,
        lease: Some(Lease {
            owner,
            ttl_us: 60_000_000,
        }),
        deadline: None,
        traceparent: None,
        app_version: None,
        skeleton_hash: None,
    };
    assert!(db.store.create_instance(&new).await.unwrap().1);
}

async fn list_executors_reads_a_base_and_its_numbered_slots_only(db: &TestDb) {
    for id in ["h/app", "h/app#2", "h/app#10", "h/apple", "h/ap", "x/app#2"] {
        register(db, id, "t").await;
    }
    let mut ids: Vec<String> = db
        .store
        .list_executors("h/app")
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["h/app", "h/app#10", "h/app#2"]);
    assert!(db.store.list_executors("h/none").await.unwrap().is_empty());
}

async fn remove_executor_releases_the_leases_it_held(db: &TestDb) {
    register(db, "w1", "t1").await;
    leased(db, "mine", "w1").await;
    leased(db, "theirs", "w2").await;
    let before = now_us();
    assert_eq!(db.store.remove_executor("w1", "t1").await.unwrap(), Some(1));
    assert!(db.store.get_executor("w1").await.unwrap().is_none());

    let mine = db.store.get_instance("mine").await.unwrap().unwrap();
    assert_eq!(mine.lease_owner, None);
    assert_eq!(mine.lease_expires_at, None);
    assert_eq!(mine.status, InstanceStatus::Running, "status is left alone");
    assert_eq!(mine.attempts, 0);
    assert!(mine.wake_at.unwrap() >= before, "due now: {mine:?}");
    let theirs = db.store.get_instance("theirs").await.unwrap().unwrap();
    assert_eq!(theirs.lease_owner.as_deref(), Some("w2"));
    // Released, another owner claims it at once.
    let lease = Lease {
        owner: "w3",
        ttl_us: 60_000_000,
    };
    assert!(db.store.claim("mine", lease).await.unwrap().is_some());
}

async fn remove_executor_with_a_stale_token_changes_nothing(db: &TestDb) {
    register(db, "w1", "new").await;
    leased(db, "mine", "w1").await;
    assert_eq!(db.store.remove_executor("w1", "old").await.unwrap(), None);
    assert_eq!(
        db.store.get_executor("w1").await.unwrap().unwrap().token,
        "new"
    );
    let mine = db.store.get_instance("mine").await.unwrap().unwrap();
    assert_eq!(mine.lease_owner.as_deref(), Some("w1"));
}

async fn the_server_clock_is_read_where_the_database_has_one(db: &TestDb) {
    let reading = db.store.read_server_clock().await.unwrap();
    if db.store.backend() == "sqlite" {
        assert_eq!(reading, None, "a SQLite file has no clock but this host's");
        return;
    }
    let reading = reading.expect("PostgreSQL has a clock of its own");
    // The test server runs on this host, on this host's clock.
    assert!(
        reading.uncertainty_us >= 0 && reading.uncertainty_us < 1_000_000,
        "{reading:?}"
    );
    assert!(
        reading.offset_us.abs() <= reading.uncertainty_us + 50_000,
        "the server's clock read {} us off this host's: {reading:?}",
        reading.offset_us
    );
}
