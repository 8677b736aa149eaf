//! Every claim says whether the instance it takes has a journal yet
//! (`InstanceRow::fresh`), on both backends: a run skips reading an empty
//! journal on that word, so it must never say "fresh" of a generation with
//! a recorded step (the run would do that step again).

#[macro_use]
mod support;

use keiro_store::{
    ContinueAsNew, HandOver, InstanceRow, NewInstance, QueueLimits, Queued, Registered, StepRow,
    Store,
};
use support::{completed, lease, TestDb, OWNER};

conformance!(
    a_default_claim_says_which_generations_have_a_journal,
    queue_claims_and_hand_overs_say_which_instances_have_a_journal,
);

const FLOW: Registered<'static> = Registered {
    name: "flow",
    signature: "sig",
};
const QUEUE: &str = "q";

fn instance(id: &str) -> NewInstance<'_> {
    NewInstance {
        signature: Some(FLOW.signature),
        ..NewInstance::new(id, FLOW.name, "[]")
    }
}

/// Journals step 0 of `id`'s generation `generation`.
async fn journal_a_step(store: &Store, id: &str, generation: i64) {
    let row = StepRow {
        workflow_id: id.to_owned(),
        generation,
        seq: 0,
        name: "charge".to_owned(),
        kind: "step".to_owned(),
        result: "1".to_owned(),
    };
    store.append_steps(&[row]).await.unwrap();
}

/// The ids of `rows` with whether each was claimed fresh, in id order.
fn freshness(rows: Vec<InstanceRow>) -> Vec<(String, bool)> {
    let mut seen: Vec<_> = rows.into_iter().map(|row| (row.id, row.fresh)).collect();
    seen.sort();
    seen
}

async fn claim_due(store: &Store) -> Vec<(String, bool)> {
    freshness(store.claim_due(lease(), &[FLOW], &[], 10).await.unwrap())
}

async fn a_default_claim_says_which_generations_have_a_journal(db: &TestDb) {
    let store = &db.store;
    for id in ["new", "ran"] {
        store.create_instance(&instance(id)).await.unwrap();
    }
    let fresh = |id: &str, fresh: bool| (id.to_owned(), fresh);
    assert_eq!(
        claim_due(store).await,
        [fresh("new", true), fresh("ran", true)]
    );
    // `ran` journals a step, then its worker lets go: the next claim must
    // read its journal; `new` still has none.
    journal_a_step(store, "ran", 0).await;
    for id in ["new", "ran"] {
        store.release(id, OWNER).await.unwrap();
    }
    assert_eq!(
        claim_due(store).await,
        [fresh("new", true), fresh("ran", false)]
    );
    // Continued as new, `ran` starts a generation with no journal.
    let next = ContinueAsNew {
        id: "ran",
        generation: 0,
        owner: OWNER,
        input: "[]",
        app_version: None,
    };
    assert!(store.continue_as_new(&next).await.unwrap());
    assert_eq!(claim_due(store).await, [fresh("ran", true)]);
}

async fn enqueue(store: &Store, id: &str) {
    let queued = Queued {
        queue: Some(QUEUE),
        priority: 0,
        partition: "",
        dedup: None,
        not_before: None,
    };
    let (_, created) = store.create_queued(&instance(id), &queued).await.unwrap();
    assert!(created, "{id} is new");
}

/// Finishes `id` handing its slot over; the successor with its freshness.
async fn finish_handing_over(store: &Store, id: &str) -> Option<(String, bool)> {
    let finish = completed(id);
    let hand_over = HandOver::new(&support::no_limits(QUEUE), FLOW, 60_000_000, &[]);
    let (applied, successor) = store
        .finish_handing_over(&[finish], &[Some(&hand_over)])
        .await
        .unwrap()
        .remove(0);
    assert!(applied, "the finish of {id} applied");
    successor.map(|row| (row.id, row.fresh))
}

async fn queue_claims_and_hand_overs_say_which_instances_have_a_journal(db: &TestDb) {
    let store = &db.store;
    // `b` and `d` ran before (a crashed worker's journal); `a` and `c` never.
    for id in ["a", "b", "c", "d"] {
        enqueue(store, id).await;
    }
    journal_a_step(store, "b", 0).await;
    journal_a_step(store, "d", 0).await;
    let limits = |concurrency| QueueLimits {
        name: QUEUE,
        concurrency: Some(concurrency),
        worker_concurrency: None,
        rate_limit: None,
    };
    let claim = |n: i64| async move {
        freshness(
            store
                .claim_queue(lease(), &[FLOW], &[], &limits(n), n)
                .await
                .unwrap(),
        )
    };
    assert_eq!(claim(1).await, [("a".to_owned(), true)]);
    assert_eq!(
        finish_handing_over(store, "a").await,
        Some(("b".to_owned(), false))
    );
    assert_eq!(
        finish_handing_over(store, "b").await,
        Some(("c".to_owned(), true))
    );
    // A claim (not a hand-over) of an instance with a journal.
    assert_eq!(
        claim(2).await,
        [("d".to_owned(), false)],
        "c runs, so one more slot is free"
    );
}
