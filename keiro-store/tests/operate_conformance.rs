//! Conformance of retry and fork, on both backends: a failed or cancelled
//! instance goes back in line with its journal, nothing else does; a fork
//! copies the journal prefix under a new id in one transaction.

#[macro_use]
mod support;

use keiro_store::{
    now_us, Crash, Finish, Fork, InstanceStatus, Lease, NewInstance, Retry, StepRow,
};
use support::TestDb;

conformance!(
    retry_requeues_a_crash_failed_instance_with_its_journal,
    retry_requeues_a_cancelled_instance,
    retry_refuses_other_statuses_and_unknown_ids,
    fork_copies_the_journal_prefix_under_the_new_id,
    fork_refuses_an_unknown_source_and_a_taken_id,
);

const OWNER: &str = "w1";

fn lease() -> Lease<'static> {
    Lease {
        owner: OWNER,
        ttl_us: 60_000_000,
    }
}

async fn create(db: &TestDb, id: &str) {
    let new = NewInstance {
        signature: Some("sig-1"),
        lease: Some(lease()),
        ..NewInstance::new(id, "flow", "[7]")
    };
    assert!(db.store.create_instance(&new).await.unwrap().1);
}

async fn steps(db: &TestDb, id: &str, count: i64) {
    let rows: Vec<StepRow> = (0..count)
        .map(|seq| StepRow {
            workflow_id: id.to_owned(),
            generation: 0,
            seq,
            name: format!("s{seq}"),
            kind: "step".to_owned(),
            result: format!("{{\"Ok\":{seq}}}"),
        })
        .collect();
    db.store.append_steps(&rows).await.unwrap();
}

async fn crash_out(db: &TestDb, id: &str) {
    let crash = Crash {
        id,
        owner: OWNER,
        error: "boom",
        max_attempts: 1,
        retry_at: now_us(),
    };
    let (status, _) = db.store.record_crash(&crash).await.unwrap().unwrap();
    assert_eq!(status, InstanceStatus::Failed);
}

async fn retry_requeues_a_crash_failed_instance_with_its_journal(db: &TestDb) {
    create(db, "a").await;
    steps(db, "a", 2).await;
    crash_out(db, "a").await;
    let before = now_us();
    assert_eq!(db.store.retry("a").await.unwrap(), Retry::Retried);
    let row = db.store.get_instance("a").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Pending);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.error, None);
    assert_eq!(row.output, None);
    assert_eq!(row.lease_owner, None);
    assert!(row.wake_at.unwrap() >= before && row.wake_at.unwrap() <= now_us());
    assert_eq!(db.store.load_journal("a", 0).await.unwrap().len(), 2);
    // It is due: a resume worker's scan finds it.
    let due = db.store.find_due(10).await.unwrap();
    assert!(due.iter().any(|row| row.id == "a"));
    // Pending is not retried again.
    assert_eq!(
        db.store.retry("a").await.unwrap(),
        Retry::NotRetryable(InstanceStatus::Pending)
    );
}

async fn retry_requeues_a_cancelled_instance(db: &TestDb) {
    create(db, "c").await;
    steps(db, "c", 1).await;
    db.store.cancel("c").await.unwrap();
    assert_eq!(db.store.retry("c").await.unwrap(), Retry::Retried);
    let row = db.store.get_instance("c").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Pending);
    assert_eq!(db.store.load_journal("c", 0).await.unwrap().len(), 1);
}

async fn retry_refuses_other_statuses_and_unknown_ids(db: &TestDb) {
    assert_eq!(db.store.retry("nobody").await.unwrap(), Retry::NotFound);
    create(db, "run").await;
    assert_eq!(
        db.store.retry("run").await.unwrap(),
        Retry::NotRetryable(InstanceStatus::Running)
    );
    for (id, status, output) in [
        ("done", InstanceStatus::Completed, "{\"Ok\":1}"),
        ("err", InstanceStatus::Failed, "{\"Err\":\"no\"}"),
    ] {
        create(db, id).await;
        let finish = Finish {
            id,
            generation: 0,
            owner: OWNER,
            status,
            output: Some(output),
            error: None,
        };
        assert!(db.store.finish(&finish).await.unwrap());
    }
    assert_eq!(
        db.store.retry("done").await.unwrap(),
        Retry::NotRetryable(InstanceStatus::Completed)
    );
    assert_eq!(db.store.retry("err").await.unwrap(), Retry::ReturnedError);
    let row = db.store.get_instance("done").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Completed);
}

async fn fork_copies_the_journal_prefix_under_the_new_id(db: &TestDb) {
    create(db, "src").await;
    steps(db, "src", 5).await;
    crash_out(db, "src").await;
    assert_eq!(
        db.store.fork("src", 3, "src-fork").await.unwrap(),
        Fork::Forked { steps: 3 }
    );
    let row = db.store.get_instance("src-fork").await.unwrap().unwrap();
    assert_eq!(row.name, "flow");
    assert_eq!(row.input, "[7]");
    assert_eq!(row.signature.as_deref(), Some("sig-1"));
    assert_eq!(row.status, InstanceStatus::Pending);
    assert_eq!(row.generation, 0);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.parent_id, None);
    let journal = db.store.load_journal("src-fork", 0).await.unwrap();
    let seqs: Vec<i64> = journal.iter().map(|step| step.seq).collect();
    assert_eq!(seqs, [0, 1, 2]);
    assert_eq!(journal[2].name, "s2");
    assert_eq!(journal[2].result, "{\"Ok\":2}");
    // The source is left alone.
    let source = db.store.get_instance("src").await.unwrap().unwrap();
    assert_eq!(source.status, InstanceStatus::Failed);
    assert_eq!(db.store.load_journal("src", 0).await.unwrap().len(), 5);
    // From seq 0: an empty journal.
    assert_eq!(
        db.store.fork("src", 0, "src-fresh").await.unwrap(),
        Fork::Forked { steps: 0 }
    );
}

async fn fork_refuses_an_unknown_source_and_a_taken_id(db: &TestDb) {
    assert_eq!(
        db.store.fork("nobody", 1, "x").await.unwrap(),
        Fork::NotFound
    );
    assert!(db.store.get_instance("x").await.unwrap().is_none());
    create(db, "one").await;
    steps(db, "one", 2).await;
    create(db, "two").await;
    assert_eq!(
        db.store.fork("one", 2, "two").await.unwrap(),
        Fork::Conflict
    );
    assert!(db.store.load_journal("two", 0).await.unwrap().is_empty());
}
