//! One conformance suite, run against both backends.
//!
//! Every case is an `async fn(&TestDb)` below; the `conformance!` invocation at
//! the end runs each one as `sqlite::<case>` on a fresh SQLite file and as
//! `postgres::<case>` on a fresh PostgreSQL database (see `support`).

#[macro_use]
mod support;

use std::time::Duration;

use keiro_store::{
    AppendOutcome, Finish, InstanceStatus, JournalWriter, Lease, NewInstance, ParentLink, StepRow,
    Store, StoreError, StoreOptions,
};
use support::TestDb;

conformance!(
    create_instance_creates_once,
    create_instance_with_lease_is_running_without_is_pending,
    create_instance_records_parent,
    concurrent_create_instance_has_one_creator,
    get_instance_of_missing_id_is_none,
    claim_takes_a_pending_instance,
    claim_refuses_a_live_foreign_lease,
    claim_by_the_same_owner_succeeds,
    claim_takes_over_an_expired_lease,
    claim_never_takes_a_finished_instance,
    claim_of_missing_id_is_none,
    concurrent_claims_have_one_winner,
    renew_lease_only_by_the_holder,
    release_only_by_the_holder,
    load_journal_returns_one_generation_in_seq_order,
    append_steps_rows_come_back_from_load_journal,
    append_steps_keeps_the_first_result,
    append_steps_mixed_batch_with_in_batch_duplicate,
    append_steps_empty_batch,
    append_steps_larger_than_one_statement,
    finish_applies_once,
    finish_is_refused_for_a_foreign_live_lease,
    requeue_set_aside_only_from_nondeterministic,
    corrupt_status_is_reported,
    writer_lands_200_concurrent_appends,
    racing_writers_converge_on_one_result,
    unpausing_a_schedule_records_the_tick_passed_over,
    redefining_a_schedule_records_its_latest_tick,
);

// ---------------------------------------------------------------------------
// Helpers

const TTL: i64 = 60_000_000;

/// The signature the helpers record for `checkout` instances.
const CHECKOUT: &str = "(Order,)->Result<Receipt,ShopError>";

fn lease(owner: &str) -> Lease<'_> {
    Lease { owner, ttl_us: TTL }
}

fn new_instance<'a>(id: &'a str, input: &'a str, lease: Option<Lease<'a>>) -> NewInstance<'a> {
    NewInstance {
        signature: Some(CHECKOUT),
        lease,
        ..NewInstance::new(id, "checkout", input)
    }
}

fn step(id: &str, generation: i64, seq: i64, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.to_owned(),
        generation,
        seq,
        name: format!("step_{seq}"),
        kind: "step".to_owned(),
        result: result.to_owned(),
    }
}

fn finish<'a>(
    id: &'a str,
    owner: &'a str,
    status: InstanceStatus,
    output: Option<&'a str>,
    error: Option<&'a str>,
) -> Finish<'a> {
    Finish {
        id,
        generation: 0,
        owner,
        status,
        output,
        error,
    }
}

async fn create(db: &TestDb, id: &str, lease: Option<Lease<'_>>) {
    let (_, created) = db
        .store
        .create_instance(&new_instance(id, "{}", lease))
        .await
        .unwrap();
    assert!(created, "`{id}` should be new");
}

async fn status_of(db: &TestDb, id: &str) -> InstanceStatus {
    db.store.get_instance(id).await.unwrap().unwrap().status
}

// ---------------------------------------------------------------------------
// create_instance / get_instance

async fn create_instance_creates_once(db: &TestDb) {
    let before = keiro_store::now_us();
    let (row, created) = db
        .store
        .create_instance(&new_instance("wf-1", r#"{"a":1}"#, None))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(row.id, "wf-1");
    assert_eq!(row.name, "checkout");
    assert_eq!(row.input, r#"{"a":1}"#);
    assert_eq!(row.generation, 0);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.output, None);
    assert_eq!(row.error, None);
    assert!(row.created_at >= before && row.updated_at == row.created_at);

    let again = NewInstance {
        name: "other",
        ..new_instance("wf-1", r#"{"a":2}"#, Some(lease("w1")))
    };
    let (existing, created) = db.store.create_instance(&again).await.unwrap();
    assert!(!created, "the second call must not create");
    assert_eq!(existing, row, "the second call returns the stored row");
    assert_eq!(db.store.get_instance("wf-1").await.unwrap(), Some(row));
}

async fn create_instance_with_lease_is_running_without_is_pending(db: &TestDb) {
    let before = keiro_store::now_us();
    let (leased, _) = db
        .store
        .create_instance(&new_instance("leased", "{}", Some(lease("w1"))))
        .await
        .unwrap();
    assert_eq!(leased.status, InstanceStatus::Running);
    assert_eq!(leased.lease_owner.as_deref(), Some("w1"));
    let expires = leased.lease_expires_at.expect("a lease expiry");
    assert!(expires >= before + TTL && expires <= keiro_store::now_us() + TTL);

    let (free, _) = db
        .store
        .create_instance(&new_instance("free", "{}", None))
        .await
        .unwrap();
    assert_eq!(free.status, InstanceStatus::Pending);
    assert_eq!(free.lease_owner, None);
    assert_eq!(free.lease_expires_at, None);
    assert_eq!(db.store.get_instance("free").await.unwrap(), Some(free));
    assert_eq!(db.store.get_instance("leased").await.unwrap(), Some(leased));
}

async fn create_instance_records_parent(db: &TestDb) {
    let child = NewInstance {
        parent: Some(ParentLink {
            id: "parent-1",
            generation: 0,
            seq: 7,
        }),
        ..new_instance("child-1", "{}", None)
    };
    let (row, created) = db.store.create_instance(&child).await.unwrap();
    assert!(created);
    assert_eq!(row.parent_id.as_deref(), Some("parent-1"));
    assert_eq!(row.parent_seq, Some(7));
    let (plain, _) = db
        .store
        .create_instance(&new_instance("plain", "{}", None))
        .await
        .unwrap();
    assert_eq!((plain.parent_id, plain.parent_seq), (None, None));
}

async fn concurrent_create_instance_has_one_creator(db: &TestDb) {
    let other = db.second_store().await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        tasks.push(tokio::spawn(async move {
            let input = format!("{{\"caller\":{i}}}");
            store
                .create_instance(&new_instance("contended", &input, None))
                .await
                .unwrap()
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    assert_eq!(results.iter().filter(|(_, created)| *created).count(), 1);
    let winner = &results.iter().find(|(_, created)| *created).unwrap().0;
    for (row, _) in &results {
        assert_eq!(row, winner, "every caller sees the one stored row");
    }
    other.close().await;
}

async fn get_instance_of_missing_id_is_none(db: &TestDb) {
    assert_eq!(db.store.get_instance("nope").await.unwrap(), None);
    create(db, "present", None).await;
    assert_eq!(db.store.get_instance("nope").await.unwrap(), None);
}

// ---------------------------------------------------------------------------
// claim / renew_lease / release

async fn claim_takes_a_pending_instance(db: &TestDb) {
    create(db, "wf", None).await;
    let before = keiro_store::now_us();
    let row = db
        .store
        .claim("wf", lease("w1"))
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(row.status, InstanceStatus::Running);
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
    assert!(row.lease_expires_at.unwrap() >= before + TTL);
    assert_eq!(db.store.get_instance("wf").await.unwrap(), Some(row));
}

async fn claim_refuses_a_live_foreign_lease(db: &TestDb) {
    create(db, "wf", Some(lease("w1"))).await;
    assert_eq!(db.store.claim("wf", lease("w2")).await.unwrap(), None);
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
}

async fn claim_by_the_same_owner_succeeds(db: &TestDb) {
    let (created, _) = db
        .store
        .create_instance(&new_instance("wf", "{}", Some(lease("w1"))))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let longer = Lease {
        owner: "w1",
        ttl_us: 10 * TTL,
    };
    let row = db
        .store
        .claim("wf", longer)
        .await
        .unwrap()
        .expect("re-claimed");
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
    assert!(row.lease_expires_at.unwrap() > created.lease_expires_at.unwrap());
}

async fn claim_takes_over_an_expired_lease(db: &TestDb) {
    let expired = Lease {
        owner: "dead",
        ttl_us: -1,
    };
    create(db, "wf", Some(expired)).await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    let row = db
        .store
        .claim("wf", lease("w2"))
        .await
        .unwrap()
        .expect("taken over");
    assert_eq!(row.lease_owner.as_deref(), Some("w2"));

    // A short lease lapses after its ttl.
    let short = Lease {
        owner: "w3",
        ttl_us: 50_000,
    };
    create(db, "wf-short", Some(short)).await;
    assert_eq!(db.store.claim("wf-short", lease("w4")).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let row = db.store.claim("wf-short", lease("w4")).await.unwrap();
    assert_eq!(row.unwrap().lease_owner.as_deref(), Some("w4"));
}

async fn claim_never_takes_a_finished_instance(db: &TestDb) {
    let finals = [
        InstanceStatus::Completed,
        InstanceStatus::Failed,
        InstanceStatus::Cancelled,
        InstanceStatus::NonDeterministic,
    ];
    for status in finals {
        let id = format!("wf-{}", status.as_str());
        create(db, &id, Some(lease("w1"))).await;
        assert!(db
            .store
            .finish(&finish(&id, "w1", status, Some("1"), None))
            .await
            .unwrap());
        assert_eq!(db.store.claim(&id, lease("w1")).await.unwrap(), None);
        assert_eq!(db.store.claim(&id, lease("w2")).await.unwrap(), None);
        assert_eq!(status_of(db, &id).await, status);
    }
}

async fn claim_of_missing_id_is_none(db: &TestDb) {
    assert_eq!(db.store.claim("nope", lease("w1")).await.unwrap(), None);
}

async fn concurrent_claims_have_one_winner(db: &TestDb) {
    let other = db.second_store().await;
    for round in 0..5 {
        let id = format!("wf-{round}");
        create(db, &id, None).await;
        let owners: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
        let mut tasks = Vec::new();
        for (i, owner) in owners.into_iter().enumerate() {
            let store = if i % 2 == 0 {
                db.store.clone()
            } else {
                other.clone()
            };
            let id = id.clone();
            tasks.push(tokio::spawn(async move {
                let won = store.claim(&id, lease(&owner)).await.unwrap();
                won.map(|row| (owner, row))
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            winners.extend(task.await.unwrap());
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one claim wins");
        let (owner, row) = &winners[0];
        assert_eq!(row.lease_owner.as_ref(), Some(owner));
        let stored = db.store.get_instance(&id).await.unwrap().unwrap();
        assert_eq!(stored.lease_owner.as_ref(), Some(owner));
    }
    other.close().await;
}

async fn renew_lease_only_by_the_holder(db: &TestDb) {
    let (created, _) = db
        .store
        .create_instance(&new_instance("wf", "{}", Some(lease("w1"))))
        .await
        .unwrap();
    let longer = |owner| Lease {
        owner,
        ttl_us: 10 * TTL,
    };
    assert!(!db.store.renew_lease("wf", longer("w2")).await.unwrap());
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.lease_expires_at, created.lease_expires_at);
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));

    assert!(db.store.renew_lease("wf", longer("w1")).await.unwrap());
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert!(row.lease_expires_at.unwrap() >= created.lease_expires_at.unwrap() + 9 * TTL);

    assert!(!db.store.renew_lease("missing", longer("w1")).await.unwrap());
    // A finished instance has no lease left to renew.
    assert!(db
        .store
        .finish(&finish("wf", "w1", InstanceStatus::Completed, None, None))
        .await
        .unwrap());
    assert!(!db.store.renew_lease("wf", longer("w1")).await.unwrap());
}

async fn release_only_by_the_holder(db: &TestDb) {
    create(db, "wf", Some(lease("w1"))).await;
    db.store.release("wf", "w2").await.unwrap();
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
    assert!(row.lease_expires_at.is_some());

    db.store.release("wf", "w1").await.unwrap();
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.lease_expires_at, None);
    assert_eq!(row.status, InstanceStatus::Running, "status is left alone");
    // Released, anyone may claim it.
    assert!(db.store.claim("wf", lease("w2")).await.unwrap().is_some());
    db.store.release("missing", "w1").await.unwrap();
}

// ---------------------------------------------------------------------------
// load_journal / append_steps

async fn load_journal_returns_one_generation_in_seq_order(db: &TestDb) {
    create(db, "wf", None).await;
    create(db, "other", None).await;
    let rows = vec![
        step("wf", 0, 2, "\"c\""),
        step("wf", 1, 0, "\"gen1\""),
        step("wf", 0, 0, "\"a\""),
        step("other", 0, 1, "\"x\""),
        step("wf", 0, 10, "\"d\""),
        step("wf", 0, 1, "\"b\""),
    ];
    db.store.append_steps(&rows).await.unwrap();
    let journal = db.store.load_journal("wf", 0).await.unwrap();
    let seqs: Vec<i64> = journal.iter().map(|s| s.seq).collect();
    assert_eq!(seqs, vec![0, 1, 2, 10]);
    assert_eq!(journal[0], step("wf", 0, 0, "\"a\""));
    assert_eq!(journal[3], step("wf", 0, 10, "\"d\""));
    assert_eq!(
        db.store.load_journal("wf", 1).await.unwrap(),
        vec![step("wf", 1, 0, "\"gen1\"")]
    );
    assert_eq!(db.store.load_journal("wf", 2).await.unwrap(), vec![]);
    assert_eq!(db.store.load_journal("missing", 0).await.unwrap(), vec![]);
}

async fn append_steps_rows_come_back_from_load_journal(db: &TestDb) {
    create(db, "wf", None).await;
    let rows: Vec<StepRow> = (0..5)
        .map(|seq| StepRow {
            kind: ["step", "now", "uuid", "sleep", "child"][seq as usize].to_owned(),
            ..step(
                "wf",
                0,
                seq,
                &format!("{{\"n\":{seq},\"s\":\"é ' \\\" ∑\"}}"),
            )
        })
        .collect();
    let outcomes = db.store.append_steps(&rows).await.unwrap();
    assert_eq!(outcomes, vec![AppendOutcome::Inserted; 5]);
    assert_eq!(db.store.load_journal("wf", 0).await.unwrap(), rows);
}

async fn append_steps_keeps_the_first_result(db: &TestDb) {
    create(db, "wf", None).await;
    let first = step("wf", 0, 0, "\"first\"");
    assert_eq!(
        db.store
            .append_steps(std::slice::from_ref(&first))
            .await
            .unwrap(),
        vec![AppendOutcome::Inserted]
    );
    let second = StepRow {
        name: "renamed".to_owned(),
        kind: "now".to_owned(),
        ..step("wf", 0, 0, "\"second\"")
    };
    assert_eq!(
        db.store.append_steps(&[second]).await.unwrap(),
        vec![AppendOutcome::Existing(first.clone())]
    );
    assert_eq!(db.store.load_journal("wf", 0).await.unwrap(), vec![first]);
}

async fn append_steps_mixed_batch_with_in_batch_duplicate(db: &TestDb) {
    create(db, "wf", None).await;
    let old1 = step("wf", 0, 1, "\"old1\"");
    let old3 = step("wf", 0, 3, "\"old3\"");
    db.store
        .append_steps(&[old1.clone(), old3.clone()])
        .await
        .unwrap();

    let new0 = step("wf", 0, 0, "\"new0\"");
    let new2 = step("wf", 0, 2, "\"new2\"");
    let new2_again = step("wf", 0, 2, "\"new2-again\"");
    let new2_third = step("wf", 0, 2, "\"new2-third\"");
    let batch = vec![
        new2.clone(),
        step("wf", 0, 1, "\"ignored1\""),
        new0.clone(),
        new2_again,
        step("wf", 0, 3, "\"ignored3\""),
        step("wf", 0, 3, "\"ignored3-again\""),
        new2_third,
    ];
    let outcomes = db.store.append_steps(&batch).await.unwrap();
    assert_eq!(
        outcomes,
        vec![
            AppendOutcome::Inserted,
            AppendOutcome::Existing(old1.clone()),
            AppendOutcome::Inserted,
            AppendOutcome::Existing(new2.clone()),
            AppendOutcome::Existing(old3.clone()),
            AppendOutcome::Existing(old3.clone()),
            AppendOutcome::Existing(new2.clone()),
        ]
    );
    assert_eq!(
        db.store.load_journal("wf", 0).await.unwrap(),
        vec![new0, old1, new2, old3]
    );
}

/// A batch larger than one multi-row statement (SQLite: 256 rows) is
/// recorded whole, and a step id recorded before keeps its first result
/// there too.
async fn append_steps_larger_than_one_statement(db: &TestDb) {
    create(db, "wf", None).await;
    let old = step("wf", 0, 400, "\"old\"");
    db.store
        .append_steps(std::slice::from_ref(&old))
        .await
        .unwrap();
    let batch: Vec<StepRow> = (0..600)
        .map(|seq| step("wf", 0, seq, &seq.to_string()))
        .collect();
    let outcomes = db.store.append_steps(&batch).await.unwrap();
    let expected: Vec<AppendOutcome> = (0..600)
        .map(|seq| match seq {
            400 => AppendOutcome::Existing(old.clone()),
            _ => AppendOutcome::Inserted,
        })
        .collect();
    assert_eq!(outcomes, expected);
    let mut journaled = batch;
    journaled[400] = old;
    assert_eq!(db.store.load_journal("wf", 0).await.unwrap(), journaled);
}

async fn append_steps_empty_batch(db: &TestDb) {
    assert_eq!(db.store.append_steps(&[]).await.unwrap(), vec![]);
}

// ---------------------------------------------------------------------------
// finish / requeue_set_aside

async fn finish_applies_once(db: &TestDb) {
    create(db, "wf", Some(lease("w1"))).await;
    let done = finish(
        "wf",
        "w1",
        InstanceStatus::Completed,
        Some("\"out\""),
        Some("a note"),
    );
    assert!(db.store.finish(&done).await.unwrap());
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Completed);
    assert_eq!(row.output.as_deref(), Some("\"out\""));
    assert_eq!(row.error.as_deref(), Some("a note"));
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.lease_expires_at, None);
    assert_eq!(row.wake_at, None);

    let again = finish(
        "wf",
        "w1",
        InstanceStatus::Failed,
        Some("\"other\""),
        Some("boom"),
    );
    assert!(!db.store.finish(&again).await.unwrap());
    assert_eq!(db.store.get_instance("wf").await.unwrap().unwrap(), row);

    // An unleased (pending) instance may be finished by anyone.
    create(db, "free", None).await;
    let failed = finish("free", "w9", InstanceStatus::Failed, None, Some("boom"));
    assert!(db.store.finish(&failed).await.unwrap());
    let row = db.store.get_instance("free").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Failed);
    assert_eq!((row.output, row.error.as_deref()), (None, Some("boom")));

    // Another generation's finish does not apply.
    create(db, "gen", None).await;
    let wrong_generation = Finish {
        generation: 1,
        ..finish("gen", "w1", InstanceStatus::Completed, None, None)
    };
    assert!(!db.store.finish(&wrong_generation).await.unwrap());
    assert_eq!(status_of(db, "gen").await, InstanceStatus::Pending);
    assert!(!db
        .store
        .finish(&finish(
            "missing",
            "w1",
            InstanceStatus::Completed,
            None,
            None
        ))
        .await
        .unwrap());
}

async fn finish_is_refused_for_a_foreign_live_lease(db: &TestDb) {
    create(db, "wf", Some(lease("w1"))).await;
    let foreign = finish("wf", "w2", InstanceStatus::Completed, Some("\"x\""), None);
    assert!(!db.store.finish(&foreign).await.unwrap());
    let row = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Running);
    assert_eq!(row.output, None);
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
}

async fn requeue_set_aside_only_from_nondeterministic(db: &TestDb) {
    create(db, "bad", Some(lease("w1"))).await;
    let aside = finish(
        "bad",
        "w1",
        InstanceStatus::NonDeterministic,
        None,
        Some("step 3: journal has `charge` (step), code calls `refund` (step)"),
    );
    assert!(db.store.finish(&aside).await.unwrap());
    assert!(db.store.requeue_set_aside("bad").await.unwrap());
    let row = db.store.get_instance("bad").await.unwrap().unwrap();
    assert_eq!(row.status, InstanceStatus::Pending);
    assert_eq!(row.error, None);
    assert!(!db.store.requeue_set_aside("bad").await.unwrap());
    assert!(db.store.claim("bad", lease("w2")).await.unwrap().is_some());

    // Nothing else is requeued.
    create(db, "pending", None).await;
    create(db, "running", Some(lease("w1"))).await;
    create(db, "done", Some(lease("w1"))).await;
    let done = finish("done", "w1", InstanceStatus::Completed, Some("1"), None);
    assert!(db.store.finish(&done).await.unwrap());
    for (id, status) in [
        ("pending", InstanceStatus::Pending),
        ("running", InstanceStatus::Running),
        ("done", InstanceStatus::Completed),
    ] {
        assert!(!db.store.requeue_set_aside(id).await.unwrap(), "{id}");
        assert_eq!(status_of(db, id).await, status);
    }
    assert!(!db.store.requeue_set_aside("missing").await.unwrap());
}

// ---------------------------------------------------------------------------
// Corrupt rows

async fn corrupt_status_is_reported(db: &TestDb) {
    create(db, "broken-7", None).await;
    let changed = db
        .execute_raw(
            "UPDATE keiro_workflows SET status = 'exploded' WHERE id = ?1",
            &["broken-7"],
        )
        .await;
    assert_eq!(changed, 1);
    match db.store.get_instance("broken-7").await {
        Err(StoreError::Corrupt { what }) => {
            assert!(what.contains("broken-7"), "names the row: {what}");
            assert!(what.contains("exploded"), "names the value: {what}");
        }
        other => panic!("expected StoreError::Corrupt, got {other:?}"),
    }
    // create_instance reads the existing row back and reports it too.
    let err = db
        .store
        .create_instance(&new_instance("broken-7", "{}", None))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { what } if what.contains("broken-7")),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------
// The journal writer

async fn writer_lands_200_concurrent_appends(db: &TestDb) {
    create(db, "wf", None).await;
    let writer = JournalWriter::spawn(db.store.clone());
    let mut tasks = Vec::new();
    for seq in 0..200 {
        let writer = writer.clone();
        tasks.push(tokio::spawn(async move {
            writer.append(step("wf", 0, seq, &seq.to_string())).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), AppendOutcome::Inserted);
    }
    let journal = db.store.load_journal("wf", 0).await.unwrap();
    assert_eq!(journal.len(), 200);
    let expected: Vec<StepRow> = (0..200).map(|s| step("wf", 0, s, &s.to_string())).collect();
    assert_eq!(journal, expected);
    let counted = db
        .execute_raw(
            "UPDATE keiro_steps SET kind = kind WHERE workflow_id = ?1",
            &["wf"],
        )
        .await;
    assert_eq!(counted, 200, "exactly 200 rows stored");
}

async fn racing_writers_converge_on_one_result(db: &TestDb) {
    create(db, "wf", None).await;
    let other = db.second_store().await;
    let writer_a = JournalWriter::spawn(db.store.clone());
    let writer_b = JournalWriter::spawn(other.clone());
    let mut tasks = Vec::new();
    // Writer `a` queues the step ids upwards and `b` downwards, so their
    // batches overlap in opposite orders (a lock-order deadlock, if the store
    // inserted rows in the order given).
    const STEPS: i64 = 200;
    for i in 0..STEPS {
        for (writer, who, seq) in [
            (writer_a.clone(), "a", i),
            (writer_b.clone(), "b", STEPS - 1 - i),
        ] {
            tasks.push(tokio::spawn(async move {
                let row = step("wf", 0, seq, &format!("\"{who}\""));
                let outcome = writer.append(row.clone()).await.unwrap();
                (row, outcome)
            }));
        }
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let journal = db.store.load_journal("wf", 0).await.unwrap();
    assert_eq!(journal.len(), STEPS as usize);
    for stored in &journal {
        let attempts: Vec<&(StepRow, AppendOutcome)> = results
            .iter()
            .filter(|(row, _)| row.seq == stored.seq)
            .collect();
        assert_eq!(attempts.len(), 2);
        let inserted: Vec<&StepRow> = attempts
            .iter()
            .filter(|(_, o)| *o == AppendOutcome::Inserted)
            .map(|(row, _)| row)
            .collect();
        assert_eq!(
            inserted,
            vec![stored],
            "seq {}: one writer inserted it",
            stored.seq
        );
        for (row, outcome) in attempts {
            if row != stored {
                assert_eq!(outcome, &AppendOutcome::Existing(stored.clone()));
            }
        }
    }
    drop((writer_a, writer_b));
    other.close().await;
}

// ---------------------------------------------------------------------------
// Connecting (no database of their own needed)

#[tokio::test]
async fn unknown_scheme_is_an_invalid_url_with_the_password_redacted() {
    let err = Store::connect("mysql://bob:hunter2@db/keiro", &StoreOptions::default())
        .await
        .unwrap_err();
    let StoreError::InvalidUrl { url, .. } = &err else {
        panic!("expected InvalidUrl, got {err:?}");
    };
    assert_eq!(url, "mysql://bob:***@db/keiro");
    let message = err.to_string();
    assert!(message.contains("mysql://bob:***@db/keiro"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

#[tokio::test]
async fn malformed_postgres_url_is_an_invalid_url_with_the_password_redacted() {
    for bad in [
        "postgres://bob:hunter2@localhost:99999/keiro",
        "postgres://bob:hunter2@localhost/keiro?sslmode=sometimes",
    ] {
        let err = Store::connect(bad, &StoreOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::InvalidUrl { url, .. } if url.contains("bob:***@localhost")),
            "{bad}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("bob:***@localhost"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }
}

#[tokio::test]
async fn malformed_sqlite_url_is_an_invalid_url() {
    let err = Store::connect("sqlite://keiro.db?mode=sometimes", &StoreOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::InvalidUrl { url, .. } if url == "sqlite://keiro.db?mode=sometimes"),
        "{err:?}"
    );
}

#[tokio::test]
async fn unreachable_postgres_is_a_connect_error_without_the_password() {
    let started = std::time::Instant::now();
    let err = Store::connect(
        "postgres://nobody:secret@127.0.0.1:1/x",
        &StoreOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    let StoreError::Connect { url, .. } = &err else {
        panic!("expected Connect, got {err:?}");
    };
    assert_eq!(url, "postgres://nobody:***@127.0.0.1:1/x");
    assert!(err.is_transient());
    let message = err.to_string();
    assert!(!message.contains("secret"), "{message}");
    assert!(!format!("{err:?}").contains("secret"), "{err:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        assert!(!cause.to_string().contains("secret"), "{cause}");
        source = cause.source();
    }
}

#[tokio::test]
async fn postgres_migrations_are_idempotent_and_leave_public_alone() {
    let (name, url) = support::create_postgres_database().await;
    // Two processes starting at once, then a restart.
    let options = support::test_options();
    let (a, b) = tokio::join!(
        Store::connect(&url, &options),
        Store::connect(&url, &options)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let c = Store::connect(&url, &support::test_options())
        .await
        .unwrap();
    let Store::Postgres(pg) = &c else {
        panic!("expected the PostgreSQL backend, got {}", c.backend());
    };
    let public: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(pg.pool())
    .await
    .unwrap();
    assert_eq!(public, Vec::<String>::new(), "keiro keeps out of `public`");
    let keiro: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'keiro'",
    )
    .fetch_all(pg.pool())
    .await
    .unwrap();
    for table in ["_sqlx_migrations", "workflows", "steps"] {
        assert!(
            keiro.iter().any(|t| t == table),
            "keiro.{table} in {keiro:?}"
        );
    }
    // Every embedded migration applied exactly once, despite the race.
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM keiro._sqlx_migrations ORDER BY version")
            .fetch_all(pg.pool())
            .await
            .unwrap();
    let embedded: Vec<(i64, bool)> = keiro_store::POSTGRES_MIGRATOR
        .iter()
        .map(|m| (m.version, true))
        .collect();
    assert_eq!(applied, embedded);
    for store in [a, b, c] {
        store.close().await;
    }
    support::drop_postgres_database(&name).await;
}

// ---------------------------------------------------------------------------
// PostgreSQL only: a statement that waits on another transaction's insert of
// the same key must still report the row that transaction committed, although
// that row is newer than the waiting statement's snapshot.

/// A fresh PostgreSQL test database, with an instance `wf` when
/// `with_instance`, where another session's transaction holds `insert`
/// uncommitted.
async fn behind_an_open_insert(
    with_instance: bool,
    insert: &str,
) -> (TestDb, sqlx::Transaction<'static, sqlx::Postgres>) {
    let db = TestDb::postgres().await;
    let Store::Postgres(pg) = &db.store else {
        panic!("expected the PostgreSQL backend");
    };
    if with_instance {
        create(&db, "wf", None).await;
    }
    let mut theirs = pg.pool().begin().await.unwrap();
    sqlx::query(insert).execute(&mut *theirs).await.unwrap();
    (db, theirs)
}

/// [`behind_an_open_insert`] of step `seq` of instance `wf`, with result
/// `"theirs"`.
async fn behind_their_step(seq: i64) -> (TestDb, sqlx::Transaction<'static, sqlx::Postgres>) {
    let insert = format!(
        "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, created_at) \
         VALUES ('wf', 0, {seq}, 'step_{seq}', 'step', '\"theirs\"', 1)"
    );
    behind_an_open_insert(true, &insert).await
}

/// Waits until some session on the test database is blocked on a lock.
async fn wait_until_blocked(db: &TestDb) {
    let Store::Postgres(pg) = &db.store else {
        panic!("expected the PostgreSQL backend");
    };
    let pool = pg.pool();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the statement never blocked on the open insert"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_create_instance_behind_a_concurrent_insert_returns_that_row() {
    let (db, theirs) = behind_an_open_insert(
        false,
        "INSERT INTO keiro.workflows (id, name, status, input, created_at, updated_at) \
         VALUES ('wf', 'theirs', 'pending', '\"theirs\"', 1, 1)",
    )
    .await;
    let store = db.store.clone();
    let mine = tokio::spawn(async move {
        store
            .create_instance(&new_instance("wf", "\"mine\"", None))
            .await
    });
    wait_until_blocked(&db).await;
    theirs.commit().await.unwrap();
    let (row, created) = mine.await.unwrap().unwrap();
    assert!(!created);
    assert_eq!(
        (row.name.as_str(), row.input.as_str()),
        ("theirs", "\"theirs\"")
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_append_steps_behind_a_concurrent_insert_returns_that_row() {
    let (db, theirs) = behind_their_step(1).await;
    let store = db.store.clone();
    let mine = tokio::spawn(async move {
        store
            .append_steps(&[
                step("wf", 0, 0, "\"mine0\""),
                step("wf", 0, 1, "\"mine1\""),
                step("wf", 0, 1, "\"mine1-again\""),
            ])
            .await
    });
    wait_until_blocked(&db).await;
    theirs.commit().await.unwrap();
    let theirs_row = step("wf", 0, 1, "\"theirs\"");
    assert_eq!(
        mine.await.unwrap().unwrap(),
        vec![
            AppendOutcome::Inserted,
            AppendOutcome::Existing(theirs_row.clone()),
            AppendOutcome::Existing(theirs_row.clone()),
        ]
    );
    assert_eq!(
        db.store.load_journal("wf", 0).await.unwrap(),
        vec![step("wf", 0, 0, "\"mine0\""), theirs_row]
    );
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_append_steps_lets_an_aborted_insert_go() {
    let (db, theirs) = behind_their_step(0).await;
    let store = db.store.clone();
    let mine =
        tokio::spawn(async move { store.append_steps(&[step("wf", 0, 0, "\"mine\"")]).await });
    wait_until_blocked(&db).await;
    theirs.rollback().await.unwrap();
    assert_eq!(mine.await.unwrap().unwrap(), vec![AppendOutcome::Inserted]);
    assert_eq!(
        db.store.load_journal("wf", 0).await.unwrap(),
        vec![step("wf", 0, 0, "\"mine\"")]
    );
    db.finish().await;
}

/// Changing a schedule's cron expression or time zone records the new
/// definition's latest tick as its last (only ever forward), so a worker
/// starting later does not run it as a missed tick; writing the same
/// definition again, or changing only the call, keeps the last tick.
async fn redefining_a_schedule_records_its_latest_tick(db: &TestDb) {
    let store = &db.store;
    let def = |name: &'static str, cron: &'static str, input, latest| keiro_store::ScheduleDef {
        name,
        cron,
        timezone: "UTC",
        workflow: "report",
        input,
        latest_tick: latest,
    };
    let last = |name: &'static str| async move {
        store.schedule_named(name).await.unwrap().unwrap().last_tick
    };
    for (name, input) in [("dynamic", Some("[]")), ("static", None)] {
        // A new schedule has no last tick, whatever it is given.
        assert!(store
            .put_schedule(&def(name, "0 0 2 * * *", input, Some(7_000_000)))
            .await
            .unwrap());
        assert_eq!(last(name).await, None, "{name}");
        store.record_schedule_tick(name, 5_000_000).await.unwrap();
        // The same cron: kept (a dynamic one's new call too).
        let same = def(name, "0 0 2 * * *", input.map(|_| "[1]"), Some(9_000_000));
        store.put_schedule(&same).await.unwrap();
        assert_eq!(last(name).await, Some(5_000_000), "{name}");
        // A new cron: its latest tick, never back.
        let earlier = def(name, "0 0 3 * * *", input, Some(4_000_000));
        assert!(store.put_schedule(&earlier).await.unwrap());
        assert_eq!(last(name).await, Some(5_000_000), "{name}");
        let later = def(name, "0 0 6 * * *", input, Some(8_000_000));
        assert!(store.put_schedule(&later).await.unwrap());
        assert_eq!(last(name).await, Some(8_000_000), "{name}");
        // None known: kept.
        assert!(store
            .put_schedule(&def(name, "0 0 7 * * *", input, None))
            .await
            .unwrap());
        assert_eq!(last(name).await, Some(8_000_000), "{name}");
    }
}

/// Resuming a schedule records the latest tick that fell while it was paused
/// in the same statement, only ever moving `last_tick` forward; an unknown
/// name changes nothing.
async fn unpausing_a_schedule_records_the_tick_passed_over(db: &TestDb) {
    let store = &db.store;
    let def = keiro_store::ScheduleDef {
        name: "nightly",
        cron: "0 0 2 * * *",
        timezone: "UTC",
        workflow: "report",
        input: Some("[]"),
        latest_tick: None,
    };
    assert!(store.put_schedule(&def).await.unwrap());
    let row = || async { store.schedule_named("nightly").await.unwrap().unwrap() };
    assert!(store.set_schedule_paused("nightly", true).await.unwrap());
    assert!(row().await.paused);
    assert!(store
        .unpause_schedule("nightly", Some(5_000_000))
        .await
        .unwrap());
    let resumed = row().await;
    assert_eq!(
        (resumed.paused, resumed.last_tick),
        (false, Some(5_000_000))
    );
    // Never back, and not at all without a tick passed over.
    store.set_schedule_paused("nightly", true).await.unwrap();
    assert!(store
        .unpause_schedule("nightly", Some(4_000_000))
        .await
        .unwrap());
    assert_eq!(row().await.last_tick, Some(5_000_000));
    store.set_schedule_paused("nightly", true).await.unwrap();
    assert!(store.unpause_schedule("nightly", None).await.unwrap());
    let resumed = row().await;
    assert_eq!(
        (resumed.paused, resumed.last_tick),
        (false, Some(5_000_000))
    );
    assert!(!store.unpause_schedule("missing", Some(1)).await.unwrap());
}
