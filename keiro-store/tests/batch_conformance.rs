//! Conformance of the batched writes the group-commit writer issues (one
//! statement for many instances), on both backends: a batch of creates or
//! finishes gives what each alone would.

#[macro_use]
mod support;

use keiro_store::{now_us, Finish, InstanceStatus, NewInstance, Outcome, ParentLink};
use support::{create_flow as create, lease, TestDb, OWNER};

conformance!(
    a_batch_of_creates_is_each_create_in_turn,
    a_batch_of_finishes_is_each_finish_in_turn,
    an_instance_created_ended_is_inserted_finished,
);

/// `create_ended` (a short awaited workflow's one commit) inserts each new
/// instance already finished, alone (one statement) or several at once; an
/// id that exists keeps its row, alone or in a batch; a finish that is not an
/// end of the instance is refused before anything is written.
async fn an_instance_created_ended_is_inserted_finished(db: &TestDb) {
    let new = |id: &'static str| NewInstance {
        signature: Some("(u32,)->u32"),
        lease: Some(lease()),
        app_version: Some("v1"),
        ..NewInstance::new(id, "flow", "[7]")
    };
    let end = |id: &'static str, status: InstanceStatus, output: Option<&'static str>| Finish {
        id,
        generation: 0,
        owner: OWNER,
        status,
        output,
        error: None,
    };
    let ended = db
        .store
        .create_ended(&[(
            new("alone"),
            end("alone", InstanceStatus::Completed, Some("14")),
        )])
        .await
        .unwrap();
    let [(row, true)] = ended.as_slice() else {
        panic!("created: {ended:?}");
    };
    let stored = db.store.get_instance("alone").await.unwrap().unwrap();
    for row in [row, &stored] {
        assert_eq!(row.status, InstanceStatus::Completed);
        assert_eq!(row.output.as_deref(), Some("14"));
        assert_eq!(row.input, "[7]");
        assert_eq!(row.signature.as_deref(), Some("(u32,)->u32"));
        assert_eq!(row.app_version.as_deref(), Some("v1"));
        assert_eq!((row.lease_owner.as_deref(), row.wake_at), (None, None));
        assert_eq!(row.created_at, row.updated_at);
    }
    // Two at once, one of them an id taken already: that row is left alone.
    let ended = db
        .store
        .create_ended(&[
            (
                new("alone"),
                end("alone", InstanceStatus::Failed, Some("\"no\"")),
            ),
            (
                new("second"),
                end("second", InstanceStatus::Failed, Some("\"no\"")),
            ),
        ])
        .await
        .unwrap();
    let created: Vec<(&str, bool)> = ended.iter().map(|(r, c)| (r.id.as_str(), *c)).collect();
    assert_eq!(created, [("alone", false), ("second", true)]);
    assert_eq!(ended[0].0.output.as_deref(), Some("14"));
    let stored = db.store.get_instance("alone").await.unwrap().unwrap();
    assert_eq!(stored.status, InstanceStatus::Completed);
    let stored = db.store.get_instance("second").await.unwrap().unwrap();
    assert_eq!(stored.status, InstanceStatus::Failed);
    assert_eq!(stored.output.as_deref(), Some("\"no\""));
    // Alone, an id taken already: its stored row comes back, untouched.
    let ended = db
        .store
        .create_ended(&[(
            new("second"),
            end("second", InstanceStatus::Completed, Some("1")),
        )])
        .await
        .unwrap();
    let [(row, false)] = ended.as_slice() else {
        panic!("not left alone: {ended:?}");
    };
    assert_eq!(row.status, InstanceStatus::Failed);
    assert_eq!(row.output.as_deref(), Some("\"no\""));
    let stored = db.store.get_instance("second").await.unwrap().unwrap();
    assert_eq!(stored.status, InstanceStatus::Failed);
    // Not an end: refused, nothing written.
    let refused = db
        .store
        .create_ended(&[(new("third"), end("third", InstanceStatus::Running, None))])
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(db.store.get_instance("third").await.unwrap().is_none());
}

/// Several creates in one call (the writer's batch; one statement on
/// PostgreSQL) give what each alone would: a child's inherited deadline, the
/// stored row for an id taken already, and for an id twice in the batch,
/// created by the first and found by the second.
async fn a_batch_of_creates_is_each_create_in_turn(db: &TestDb) {
    let at = now_us() + 3_600_000_000;
    assert_eq!(create(db, "p", None, Some(at)).await, at);
    let new = |id: &'static str, parent: Option<&'static str>, deadline: Option<i64>| NewInstance {
        id,
        name: "flow",
        input: "[]",
        signature: Some("()->()"),
        parent: parent.map(|parent| ParentLink {
            id: parent,
            generation: 0,
            seq: 3,
        }),
        lease: (id != "twice").then(lease),
        deadline,
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        app_version: Some("v2"),
        skeleton_hash: Some("abc"),
    };
    let batch = [
        new("p/none", Some("p"), None),
        new("p/earlier", Some("p"), Some(at - 5)),
        new("p/later", Some("p"), Some(at + 5)),
        new("p", None, Some(at + 1_000)),
        new("twice", None, None),
        new("twice", None, Some(at)),
    ];
    let created = db.store.create_instances(&batch).await.unwrap();
    let fresh: Vec<bool> = created.iter().map(|(_, fresh)| *fresh).collect();
    assert_eq!(fresh, [true, true, true, false, true, false]);
    let deadlines: Vec<Option<i64>> = created.iter().map(|(row, _)| row.deadline).collect();
    assert_eq!(
        deadlines,
        [Some(at), Some(at - 5), Some(at), Some(at), None, None]
    );
    let (child, _) = &created[0];
    assert_eq!(child.parent_id.as_deref(), Some("p"));
    assert_eq!(child.parent_seq, Some(3));
    assert_eq!(child.status, InstanceStatus::Running);
    assert_eq!(child.lease_owner.as_deref(), Some(OWNER));
    assert_eq!(child.signature.as_deref(), Some("()->()"));
    assert_eq!(child.app_version.as_deref(), Some("v2"));
    assert_eq!(child.skeleton_hash.as_deref(), Some("abc"));
    let (twice, _) = &created[4];
    assert_eq!(twice.status, InstanceStatus::Pending);
    assert_eq!(twice.lease_owner, None);
    assert!(twice.wake_at.is_some(), "a pending instance is due");
    for (row, _) in &created {
        let stored = db.store.get_instance(&row.id).await.unwrap().unwrap();
        assert_eq!(stored.deadline, row.deadline, "{}", row.id);
        assert_eq!(stored.status, row.status, "{}", row.id);
    }
}

/// Several finishes in one call (the writer's batch; one statement on
/// either backend) give what each alone would: a finish applies only under
/// its owner's lease (or none) and only once, and a finished child reports
/// to its parent in the same transaction.
async fn a_batch_of_finishes_is_each_finish_in_turn(db: &TestDb) {
    create(db, "parent", None, None).await;
    for seq in 0..2 {
        let child = NewInstance {
            id: ["parent/0", "parent/1"][seq],
            name: "flow",
            input: "[]",
            signature: None,
            parent: Some(ParentLink {
                id: "parent",
                generation: 0,
                seq: seq as i64,
            }),
            lease: Some(lease()),
            deadline: None,
            traceparent: None,
            app_version: None,
            skeleton_hash: None,
        };
        db.store.create_instance(&child).await.unwrap();
    }
    create(db, "alone", None, None).await;
    create(db, "foreign", None, None).await;
    let finish = |id, owner, output| keiro_store::Finish {
        id,
        generation: 0,
        owner,
        status: InstanceStatus::Completed,
        output: Some(output),
        error: None,
    };
    let batch = [
        finish("parent/0", OWNER, "10"),
        finish("alone", OWNER, "11"),
        finish("foreign", "someone-else", "12"),
        finish("parent/1", OWNER, "13"),
        finish("missing", OWNER, "14"),
    ];
    let applied = db.store.finish_many(&batch).await.unwrap();
    assert_eq!(applied, [true, true, false, true, false]);
    for (id, status, output) in [
        ("parent/0", InstanceStatus::Completed, Some("10")),
        ("alone", InstanceStatus::Completed, Some("11")),
        ("foreign", InstanceStatus::Running, None),
        ("parent/1", InstanceStatus::Completed, Some("13")),
    ] {
        let row = db.store.get_instance(id).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.output.as_deref()),
            (status, output),
            "{id}"
        );
    }
    for (seq, output) in [(0, 10), (1, 13)] {
        let reported = db.store.get_step("parent", 0, seq).await.unwrap().unwrap();
        assert_eq!(reported.kind, "child");
        assert_eq!(
            Outcome::decode(&reported.result),
            Some(Outcome::Ok(serde_json::json!(output))),
            "{}",
            reported.result
        );
    }
    // Finished already: a second batch changes nothing.
    let again = db.store.finish_many(&batch[..2]).await.unwrap();
    assert_eq!(again, [false, false]);
}
