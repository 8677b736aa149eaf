//! Conformance of workflow deadlines' storage, on both backends: a child
//! inherits the earlier deadline, a suspended instance is due by its
//! deadline, and `time_out` ends the tree as `timed_out` only once the
//! deadline has passed.

#[macro_use]
mod support;

use keiro_store::{now_us, Cancellation, InstanceStatus, NewInstance, Outcome, Suspend};
use support::{create_flow as create, lease, TestDb, OWNER};

conformance!(
    a_child_deadline_is_the_earlier_of_its_own_and_its_parents,
    a_suspended_instance_is_due_by_its_deadline,
    time_out_ends_the_tree_once_the_deadline_passed,
    timed_out_round_trips_and_is_final,
);

async fn a_child_deadline_is_the_earlier_of_its_own_and_its_parents(db: &TestDb) {
    let at = now_us() + 3_600_000_000;
    assert_eq!(create(db, "p", None, Some(at)).await, at);
    assert_eq!(create(db, "p/none", Some("p"), None).await, at);
    assert_eq!(
        create(db, "p/earlier", Some("p"), Some(at - 5)).await,
        at - 5
    );
    assert_eq!(create(db, "p/later", Some("p"), Some(at + 5)).await, at);
    assert_eq!(create(db, "p/later/deep", Some("p/later"), None).await, at);
    assert_eq!(create(db, "free", None, None).await, -1);
    assert_eq!(create(db, "free/own", Some("free"), Some(at)).await, at);
    // A second create of the id keeps the stored deadline.
    let again = NewInstance {
        deadline: Some(at + 1_000),
        ..NewInstance::new("p", "flow", "[]")
    };
    let (row, created) = db.store.create_instance(&again).await.unwrap();
    assert!(!created);
    assert_eq!(row.deadline, Some(at));
}

async fn a_suspended_instance_is_due_by_its_deadline(db: &TestDb) {
    let at = now_us() + 3_600_000_000;
    // (id, wake time asked for, when it is due)
    let cases = [
        ("never", None, Some(at)),
        ("later", Some(at + 1_000), Some(at)),
        ("earlier", Some(at - 1_000), Some(at - 1_000)),
    ];
    for (id, wake_at, due) in cases {
        create(db, id, None, Some(at)).await;
        let suspend = Suspend {
            id,
            generation: 0,
            owner: OWNER,
            wake_at,
            awaiting: None,
            waiting: None,
        };
        assert!(db.store.suspend(&suspend).await.unwrap());
        let row = db.store.get_instance(id).await.unwrap().unwrap();
        assert_eq!(row.wake_at, due, "{id}");
    }
    // Without a deadline the wake time is as asked.
    create(db, "plain", None, None).await;
    let suspend = Suspend {
        id: "plain",
        generation: 0,
        owner: OWNER,
        wake_at: None,
        awaiting: None,
        waiting: None,
    };
    assert!(db.store.suspend(&suspend).await.unwrap());
    let row = db.store.get_instance("plain").await.unwrap().unwrap();
    assert_eq!(row.wake_at, None);
}

async fn time_out_ends_the_tree_once_the_deadline_passed(db: &TestDb) {
    let at = now_us() + 300_000;
    create(db, "root", None, None).await;
    create(db, "root/0", Some("root"), Some(at)).await;
    create(db, "root/0/0", Some("root/0"), None).await;
    assert_eq!(db.store.time_out("root/0").await.unwrap(), None, "not yet");
    assert_eq!(
        db.store.time_out("root").await.unwrap(),
        None,
        "no deadline"
    );
    assert_eq!(
        db.store.time_out("missing").await.unwrap(),
        Some(Cancellation::NotFound)
    );
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    assert_eq!(
        db.store.time_out("root/0").await.unwrap(),
        Some(Cancellation::Cancelled(vec![
            "root/0".to_owned(),
            "root/0/0".to_owned()
        ]))
    );
    for id in ["root/0", "root/0/0"] {
        let row = db.store.get_instance(id).await.unwrap().unwrap();
        assert_eq!(row.status, InstanceStatus::TimedOut, "{id}");
        assert_eq!((row.lease_owner, row.wake_at), (None, None), "{id}");
        assert_eq!(db.store.claim(id, lease()).await.unwrap(), None, "{id}");
    }
    // The parent, which has no deadline, runs on and reads the child's end.
    let root = db.store.get_instance("root").await.unwrap().unwrap();
    assert_eq!(root.status, InstanceStatus::Running);
    let reported = db.store.get_step("root", 0, 0).await.unwrap().unwrap();
    assert_eq!(reported.kind, "child");
    let Some(Outcome::Err(failure)) = Outcome::decode(&reported.result) else {
        panic!("{}", reported.result)
    };
    assert_eq!(failure["status"], "timed_out");
    assert_eq!(failure["deadline"], at);
    assert_eq!(
        db.store.time_out("root/0").await.unwrap(),
        Some(Cancellation::AlreadyFinal(InstanceStatus::TimedOut))
    );
    assert_eq!(
        db.store.cancel("root/0").await.unwrap(),
        Cancellation::AlreadyFinal(InstanceStatus::TimedOut)
    );
}

async fn timed_out_round_trips_and_is_final(_db: &TestDb) {
    let status = InstanceStatus::TimedOut;
    assert_eq!(status.as_str(), "timed_out");
    assert_eq!(InstanceStatus::parse("timed_out"), Some(status));
    assert!(status.is_final());
}
