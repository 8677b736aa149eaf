//! PostgreSQL: every batch of step rows is inserted in step-id order, so two
//! batches that share rows (two processes' writers, a chain and an end)
//! wait on each other in one direction and never deadlock. Checked here
//! without a race: a transaction holds step `a/1`, a batch naming `b/1`
//! before `a/1` waits on it, and meanwhile a write of `b/1` alone must go
//! through, which it cannot if the waiting batch took `b/1` first. (SQLite
//! has one writer at a time: nothing to order there.)

mod support;

use std::time::Duration;

use keiro_store::{
    AppendOutcome, Finish, InstanceStatus, Lease, NewInstance, StepRow, StepTiming, Store,
};
use support::TestDb;

const OWNER: &str = "lock-order";

/// Step 1 of instance `id`, generation 0, with `result`.
fn step(id: &str, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.to_owned(),
        generation: 0,
        seq: 1,
        name: "step".to_owned(),
        kind: "step".to_owned(),
        result: result.to_owned(),
    }
}

const UNTIMED: StepTiming = StepTiming {
    attempts: None,
    started_at: None,
};

/// A finish of `id` by [`OWNER`].
fn finish(id: &str) -> Finish<'_> {
    Finish {
        id,
        generation: 0,
        owner: OWNER,
        status: InstanceStatus::Completed,
        output: Some("null"),
        error: None,
    }
}

/// The store call under test, writing step 1 of `b` and then of `a`.
#[derive(Debug, Clone, Copy)]
enum Batch {
    /// `append_steps`, one batch of both rows.
    Append,
    /// `append_chains`, a chain for each instance.
    Chains,
    /// `finish_after_steps`, both instances' ends, each with its row.
    Ends,
}

/// What the batch reported for `b` and for `a`: `b/1` was journaled by
/// another write meanwhile (with another result), `a/1` is the batch's.
#[derive(Debug, PartialEq, Eq)]
enum Reported {
    Appended(Vec<AppendOutcome>),
    Ended(Vec<bool>),
}

impl Batch {
    async fn write(self, store: Store, a: String, b: String) -> Reported {
        let (row_a, row_b) = (step(&a, "\"mine\""), step(&b, "\"mine\""));
        match self {
            Batch::Append => Reported::Appended(store.append_steps(&[row_b, row_a]).await.unwrap()),
            Batch::Chains => {
                let (chain_b, chain_a) = ([(row_b, UNTIMED)], [(row_a, UNTIMED)]);
                let chains = store.append_chains(&[&chain_b, &chain_a]).await.unwrap();
                Reported::Appended(chains.into_iter().flatten().collect())
            }
            Batch::Ends => {
                let (rows_b, rows_a) = ([(row_b, UNTIMED)], [(row_a, UNTIMED)]);
                let done = store
                    .finish_after_steps(
                        &[finish(&b), finish(&a)],
                        &[None, None],
                        &[&rows_b, &rows_a],
                    )
                    .await
                    .unwrap();
                Reported::Ended(done.into_iter().map(|(applied, _)| applied).collect())
            }
        }
    }
}

/// Sessions of the test database waiting on a lock.
async fn waiting(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(db.pg_pool())
    .await
    .unwrap()
}

async fn a_batch_waiting_on_a_lower_step_id_holds_no_higher_one(db: &TestDb, batch: Batch) {
    let (a, b) = (format!("{batch:?}-a"), format!("{batch:?}-b"));
    for id in [&a, &b] {
        let lease = Lease {
            owner: OWNER,
            ttl_us: 600_000_000,
        };
        let new = NewInstance {
            lease: Some(lease),
            ..NewInstance::new(id, "flow", "[]")
        };
        db.store.create_instance(&new).await.unwrap();
    }
    // Holds `a/1`, uncommitted.
    let mut holder = db.pg_pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO keiro.steps (workflow_id, generation, seq, name, kind, result, created_at) \
         VALUES ($1, 0, 1, 'step', 'step', '\"held\"', 0)",
    )
    .bind(&a)
    .execute(&mut *holder)
    .await
    .unwrap();
    let waiter = tokio::spawn(batch.write(db.store.clone(), a.clone(), b.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while waiting(db).await < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{batch:?}: the batch never waited on a/1"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // `b/1` alone goes through while the batch waits on `a/1`.
    let theirs = step(&b, "\"theirs\"");
    let alone = tokio::time::timeout(
        Duration::from_secs(5),
        db.store.append_steps(std::slice::from_ref(&theirs)),
    )
    .await
    .unwrap_or_else(|_| panic!("{batch:?}: the batch waiting on a/1 holds b/1"))
    .unwrap();
    assert_eq!(alone, [AppendOutcome::Inserted], "{batch:?}");
    holder.rollback().await.unwrap();
    let reported = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| panic!("{batch:?}: the batch never finished"))
        .unwrap();
    let expected = match batch {
        Batch::Append | Batch::Chains => Reported::Appended(vec![
            AppendOutcome::Existing(theirs),
            AppendOutcome::Inserted,
        ]),
        // `b`'s end met a row of another run: it does not apply.
        Batch::Ends => Reported::Ended(vec![false, true]),
    };
    assert_eq!(reported, expected, "{batch:?}");
    let journaled = db.store.load_journal(&a, 0).await.unwrap();
    assert_eq!(journaled, [step(&a, "\"mine\"")], "{batch:?}");
}

async fn each_batch_kind_takes_step_ids_in_order(db: &TestDb) {
    for batch in [Batch::Append, Batch::Chains, Batch::Ends] {
        a_batch_waiting_on_a_lower_step_id_holds_no_higher_one(db, batch).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_each_batch_kind_takes_step_ids_in_order() {
    let db = TestDb::postgres().await;
    each_batch_kind_takes_step_ids_in_order(&db).await;
    db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_each_batch_kind_takes_step_ids_in_order() {
    let db = TestDb::pgbouncer().await;
    each_batch_kind_takes_step_ids_in_order(&db).await;
    db.finish().await;
}
