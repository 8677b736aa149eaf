//! A run's last step rows and its end commit together
//! (`Store::finish_after_steps`, and `JournalWriter::finish_after_steps`
//! through the group-commit writer), on both backends: the rows land with
//! the end; a row another executor journaled first with another result keeps
//! that result and stops the end; an end that does not apply writes none of
//! its rows; a row found with the same result (a retry of an unanswered
//! commit) does not stop it; each finish of a batch stands or falls alone; a
//! child's end reports to its parent in the same commit; a hand-over claims
//! its successor in the same commit; and rows that are not the finishing
//! instance's are refused before anything is written.
//!
//! A pipelined run's rows written ahead of its end go as a chain
//! (`Store::append_chains`, `JournalWriter::append_chain`): recorded whole,
//! or up to the first row another executor journaled first and none after
//! it, each chain of a batch alone.

#[macro_use]
mod support;

use keiro_store::{
    now_us, AppendOutcome, Finish, FinishRequest, HandOver, InstanceRow, InstanceStatus,
    JournalWriter, NewInstance, QueueLimits, Queued, Registered, StepRow, StepTiming, Store,
    StoreError,
};
use support::{completed, create_flow, lease, TestDb, OWNER};

conformance!(
    a_finish_commits_its_step_rows_with_its_end,
    a_row_journaled_with_another_result_stops_the_finish,
    an_end_that_does_not_apply_writes_none_of_its_rows,
    a_childs_end_with_its_rows_reports_to_its_parent,
    two_ends_of_one_instance_in_one_call_do_not_mix,
    a_row_journaled_with_the_same_result_lets_the_finish_apply,
    each_finish_of_a_batch_stands_or_falls_alone,
    a_hand_over_claims_the_successor_with_the_rows,
    a_row_of_another_instance_is_refused_before_anything_is_written,
    the_writer_commits_rows_and_finish_together,
    a_chain_is_recorded_whole,
    a_chain_stops_at_a_row_journaled_first,
    each_chain_of_a_batch_stands_or_falls_alone,
    two_chains_of_one_run_in_one_call_do_not_mix,
    a_malformed_chain_is_refused_before_anything_is_written,
    the_writer_records_chains,
);

/// Step `seq` of generation 0 of `id`, named `step-<seq>`, with `result`.
fn step(id: &str, seq: i64, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.to_owned(),
        generation: 0,
        seq,
        name: format!("step-{seq}"),
        kind: "step".to_owned(),
        result: result.to_owned(),
    }
}

/// A body that ran `attempts` times, the first beginning at `started_at`.
fn timing(attempts: u32, started_at: i64) -> StepTiming {
    StepTiming {
        attempts: Some(attempts),
        started_at: Some(started_at),
    }
}

async fn instance(store: &Store, id: &str) -> InstanceRow {
    store.get_instance(id).await.unwrap().unwrap()
}

/// Asserts `id` is unfinished: running under [`OWNER`]'s live lease, with no
/// output.
async fn still_running(store: &Store, id: &str) {
    let row = instance(store, id).await;
    assert_eq!(row.status, InstanceStatus::Running, "{id} is not finished");
    assert_eq!(
        row.lease_owner.as_deref(),
        Some(OWNER),
        "{id} keeps its lease"
    );
    assert!(
        row.lease_expires_at.unwrap() > now_us(),
        "{id}'s lease is live"
    );
    assert_eq!(row.output, None, "{id} has no output");
}

/// Asserts `id` is completed with output `1` ([`completed`]), its lease
/// released.
async fn finished(store: &Store, id: &str) {
    let row = instance(store, id).await;
    assert_eq!(row.status, InstanceStatus::Completed, "{id} is finished");
    assert_eq!(row.output.as_deref(), Some("1"), "{id}'s output");
    assert_eq!(row.lease_owner, None, "{id}'s lease is released");
}

/// The `(seq, result)` of each journaled row of generation 0 of `id`.
async fn journal(store: &Store, id: &str) -> Vec<(i64, String)> {
    store
        .load_journal(id, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.seq, row.result))
        .collect()
}

/// Asserts generation 0 of `id` journals exactly `rows`, each with how its
/// body ran.
async fn journaled_as(store: &Store, id: &str, rows: &[(StepRow, StepTiming)]) {
    let entries = store.load_journal_entries(id, 0).await.unwrap();
    assert_eq!(entries.len(), rows.len(), "{entries:?}");
    for (entry, (row, timing)) in entries.iter().zip(rows) {
        assert_eq!(&entry.row, row);
        assert_eq!(entry.attempts, timing.attempts, "step {}", row.seq);
        assert_eq!(entry.started_at, timing.started_at, "step {}", row.seq);
    }
}

fn pairs(rows: &[(i64, &str)]) -> Vec<(i64, String)> {
    rows.iter()
        .map(|(seq, result)| (*seq, result.to_string()))
        .collect()
}

async fn a_finish_commits_its_step_rows_with_its_end(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    let started = now_us() - 5_000_000;
    let rows = [
        (step("wf", 0, "\"charged\""), timing(3, started)),
        (step("wf", 1, "\"shipped\""), timing(1, started + 1_000)),
    ];
    let outcome = store
        .finish_after_steps(&[completed("wf")], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(true, None)]), "{outcome:?}");
    finished(store, "wf").await;
    journaled_as(store, "wf", &rows).await;
}

async fn a_row_journaled_with_another_result_stops_the_finish(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    // Another executor (which took the instance over while this run went
    // on) journaled step 0 first, with another result.
    let theirs = step("wf", 0, "\"theirs\"");
    store.append_steps(&[theirs]).await.unwrap();
    let before = instance(store, "wf").await;
    let rows = [
        (step("wf", 0, "\"ours\""), timing(1, now_us())),
        (step("wf", 1, "\"new\""), timing(2, now_us())),
    ];
    let outcome = store
        .finish_after_steps(&[completed("wf")], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
    // The end computed from "ours" is not recorded.
    still_running(store, "wf").await;
    let after = instance(store, "wf").await;
    assert_eq!(
        (after.status, after.lease_owner, after.lease_expires_at),
        (before.status, before.lease_owner, before.lease_expires_at)
    );
    // The first result stays, and no row of this run lands after it: the
    // journal would mix two runs.
    assert_eq!(journal(store, "wf").await, pairs(&[(0, "\"theirs\"")]));
    // A conflicting row that is not the first stops the finish as well, and
    // the new row before it is not written either.
    let rows = [
        (step("wf", 1, "\"fresh\""), StepTiming::default()),
        (step("wf", 0, "\"other\""), StepTiming::default()),
    ];
    let outcome = store
        .finish_after_steps(&[completed("wf")], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
    still_running(store, "wf").await;
    assert_eq!(journal(store, "wf").await, pairs(&[(0, "\"theirs\"")]));
    // So does one with the same result from another step (name or kind).
    for other in [
        StepRow {
            name: "another-step".into(),
            ..step("wf", 0, "\"theirs\"")
        },
        StepRow {
            kind: "now".into(),
            ..step("wf", 0, "\"theirs\"")
        },
    ] {
        let rows = [(other, StepTiming::default())];
        let outcome = store
            .finish_after_steps(&[completed("wf")], &[None], &[&rows])
            .await
            .unwrap();
        assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
        still_running(store, "wf").await;
    }
    let entries = store.load_journal_entries("wf", 0).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].row.name.as_str(), entries[0].row.kind.as_str()),
        ("step-0", "step")
    );
}

/// An end that does not apply for a reason of its own (another executor
/// holds the lease; the instance ended already) writes none of its rows.
async fn an_end_that_does_not_apply_writes_none_of_its_rows(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    let rows = [
        (step("wf", 0, "\"a\""), StepTiming::default()),
        (step("wf", 1, "\"b\""), StepTiming::default()),
    ];
    let stranger = Finish {
        owner: "another-executor",
        ..completed("wf")
    };
    let outcome = store
        .finish_after_steps(&[stranger], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
    still_running(store, "wf").await;
    assert_eq!(journal(store, "wf").await, pairs(&[]));
    // Once ended, a late end with rows (from a run that lost its lease)
    // writes nothing either.
    let outcome = store
        .finish_after_steps(&[completed("wf")], &[None], &[&rows[..1]])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(true, None)]), "{outcome:?}");
    let late = [(step("wf", 5, "\"late\""), StepTiming::default())];
    let outcome = store
        .finish_after_steps(&[completed("wf")], &[None], &[&late])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
    assert_eq!(journal(store, "wf").await, pairs(&[(0, "\"a\"")]));
}

/// A child's end (which must report to its parent in the same transaction,
/// so PostgreSQL's one-statement end does not take it) commits its rows, its
/// end and its outcome in the parent's journal together.
async fn a_childs_end_with_its_rows_reports_to_its_parent(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "parent", None, None).await;
    create_flow(db, "child", Some("parent"), None).await;
    let rows = [
        (step("child", 0, "\"c0\""), timing(1, now_us())),
        (step("child", 1, "\"c1\""), StepTiming::default()),
    ];
    let outcome = store
        .finish_after_steps(&[completed("child")], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(true, None)]), "{outcome:?}");
    finished(store, "child").await;
    assert_eq!(
        journal(store, "child").await,
        pairs(&[(0, "\"c0\""), (1, "\"c1\"")])
    );
    let reported = store.load_journal("parent", 0).await.unwrap();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!((reported[0].seq, reported[0].kind.as_str()), (0, "child"));
    // A child's end that does not apply writes no row and reports nothing.
    create_flow(db, "parent-2", None, None).await;
    create_flow(db, "child-2", Some("parent-2"), None).await;
    let rows = [(step("child-2", 0, "\"c0\""), StepTiming::default())];
    let stranger = Finish {
        owner: "another-executor",
        ..completed("child-2")
    };
    let outcome = store
        .finish_after_steps(&[stranger], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
    still_running(store, "child-2").await;
    assert_eq!(journal(store, "child-2").await, pairs(&[]));
    assert_eq!(journal(store, "parent-2").await, pairs(&[]));
}

/// Two ends of one instance in one call (one owner ran it twice), each
/// with its own value of a step: the first applies with its row, the second
/// does not, and it takes nothing of the first's for its own.
async fn two_ends_of_one_instance_in_one_call_do_not_mix(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    let first = [(step("wf", 0, "\"first\""), StepTiming::default())];
    let second = [
        (step("wf", 0, "\"second\""), StepTiming::default()),
        (step("wf", 1, "\"second-1\""), StepTiming::default()),
    ];
    let outcome = store
        .finish_after_steps(
            &[completed("wf"), completed("wf")],
            &[None, None],
            &[&first, &second],
        )
        .await
        .unwrap();
    let applied: Vec<bool> = outcome.iter().map(|(applied, _)| *applied).collect();
    assert_eq!(applied, [true, false], "{outcome:?}");
    finished(store, "wf").await;
    assert_eq!(journal(store, "wf").await, pairs(&[(0, "\"first\"")]));
}

async fn a_row_journaled_with_the_same_result_lets_the_finish_apply(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    // A try before this one committed step 0 but its answer was lost.
    let first = [(step("wf", 0, "\"charged\""), timing(1, now_us()))];
    store
        .append_timed_steps(&[first[0].0.clone()], &[first[0].1])
        .await
        .unwrap();
    let rows = [
        (step("wf", 0, "\"charged\""), timing(4, now_us())),
        (step("wf", 1, "\"shipped\""), StepTiming::default()),
    ];
    let outcome = store
        .finish_after_steps(&[completed("wf")], &[None], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(true, None)]), "{outcome:?}");
    finished(store, "wf").await;
    assert_eq!(
        journal(store, "wf").await,
        pairs(&[(0, "\"charged\""), (1, "\"shipped\"")])
    );
    // The row keeps what was journaled first.
    let entries = store.load_journal_entries("wf", 0).await.unwrap();
    assert_eq!(entries[0].attempts, Some(1));
}

async fn each_finish_of_a_batch_stands_or_falls_alone(db: &TestDb) {
    let store = &db.store;
    for id in ["x", "y", "z"] {
        create_flow(db, id, None, None).await;
    }
    store
        .append_steps(&[step("y", 0, "\"theirs\"")])
        .await
        .unwrap();
    let x = [(step("x", 0, "\"x0\""), StepTiming::default())];
    let y = [
        (step("y", 0, "\"ours\""), StepTiming::default()),
        (step("y", 1, "\"y1\""), StepTiming::default()),
    ];
    let z: [(StepRow, StepTiming); 0] = [];
    let outcome = store
        .finish_after_steps(
            &[completed("x"), completed("y"), completed("z")],
            &[None, None, None],
            &[&x, &y, &z],
        )
        .await
        .unwrap();
    let applied: Vec<bool> = outcome.iter().map(|(applied, _)| *applied).collect();
    assert_eq!(applied, [true, false, true], "{outcome:?}");
    assert!(outcome.iter().all(|(_, successor)| successor.is_none()));
    finished(store, "x").await;
    still_running(store, "y").await;
    finished(store, "z").await;
    assert_eq!(journal(store, "x").await, pairs(&[(0, "\"x0\"")]));
    assert_eq!(journal(store, "y").await, pairs(&[(0, "\"theirs\"")]));
    assert_eq!(journal(store, "z").await, pairs(&[]));
}

const QUEUE: &str = "q";
const FLOW: Registered<'static> = Registered {
    name: "flow",
    signature: "sig",
};
const VERSIONS: &[&str] = &["v1"];

/// Puts instance `id` of [`FLOW`] on [`QUEUE`], in partition `p`.
async fn enqueue(store: &Store, id: &str) {
    let new = NewInstance {
        signature: Some(FLOW.signature),
        app_version: Some("v1"),
        ..NewInstance::new(id, FLOW.name, "[]")
    };
    let queued = Queued {
        queue: Some(QUEUE),
        priority: 0,
        partition: "p",
        dedup: None,
        not_before: None,
    };
    let (_, created) = store.create_queued(&new, &queued).await.unwrap();
    assert!(created, "{id} is new");
}

/// Claims one of the queue's instances for [`OWNER`], under a concurrency
/// of one.
async fn claim_one(store: &Store) -> Vec<String> {
    let limits = QueueLimits {
        name: QUEUE,
        concurrency: Some(1),
        worker_concurrency: None,
        rate_limit: None,
    };
    let rows = store
        .claim_queue(lease(), &[FLOW], VERSIONS, &limits, 1)
        .await
        .unwrap();
    rows.into_iter().map(|row| row.id).collect()
}

async fn a_hand_over_claims_the_successor_with_the_rows(db: &TestDb) {
    let store = &db.store;
    enqueue(store, "a").await;
    assert_eq!(claim_one(store).await, ["a"]);
    enqueue(store, "b").await;
    enqueue(store, "c").await;
    let hand_over = HandOver::new(&support::no_limits(QUEUE), FLOW, 60_000_000, VERSIONS);
    let rows = [
        (step("a", 0, "\"a0\""), timing(1, now_us())),
        (step("a", 1, "\"a1\""), StepTiming::default()),
    ];
    let mut outcome = store
        .finish_after_steps(&[completed("a")], &[Some(&hand_over)], &[&rows])
        .await
        .unwrap();
    assert_eq!(outcome.len(), 1);
    let (applied, successor) = outcome.remove(0);
    assert!(applied);
    let successor = successor.expect("b waits for a's slot");
    assert_eq!(successor.id, "b");
    assert_eq!(successor.status, InstanceStatus::Running);
    assert_eq!(successor.lease_owner.as_deref(), Some(OWNER));
    assert!(successor.lease_expires_at.unwrap() > now_us());
    finished(store, "a").await;
    assert_eq!(
        journal(store, "a").await,
        pairs(&[(0, "\"a0\""), (1, "\"a1\"")])
    );
    assert_eq!(instance(store, "b").await.status, InstanceStatus::Running);
    // A finish its rows stop hands nothing over: the slot stays b's.
    store
        .append_steps(&[step("b", 0, "\"theirs\"")])
        .await
        .unwrap();
    let rows = [(step("b", 0, "\"ours\""), StepTiming::default())];
    let outcome = store
        .finish_after_steps(&[completed("b")], &[Some(&hand_over)], &[&rows])
        .await
        .unwrap();
    assert!(matches!(outcome.as_slice(), [(false, None)]), "{outcome:?}");
    still_running(store, "b").await;
    assert_eq!(instance(store, "c").await.status, InstanceStatus::Pending);
}

async fn a_row_of_another_instance_is_refused_before_anything_is_written(db: &TestDb) {
    let store = &db.store;
    for id in ["wf", "other"] {
        create_flow(db, id, None, None).await;
    }
    let wrong_id = step("other", 4, "\"x\"");
    let wrong_generation = StepRow {
        generation: 1,
        ..step("wf", 5, "\"x\"")
    };
    for (wrong, names) in [
        (
            wrong_id,
            ["step 4", "`other` (generation 0)", "`wf` (generation 0)"],
        ),
        (
            wrong_generation,
            ["step 5", "`wf` (generation 1)", "`wf` (generation 0)"],
        ),
    ] {
        // The good finish comes first in the batch: its rows are not
        // written either.
        let good = [(step("other", 0, "\"fine\""), StepTiming::default())];
        let bad = [
            (step("wf", 0, "\"fine\""), StepTiming::default()),
            (wrong.clone(), StepTiming::default()),
        ];
        let error = store
            .finish_after_steps(
                &[completed("other"), completed("wf")],
                &[None, None],
                &[&good, &bad],
            )
            .await
            .expect_err("a row of another instance is refused");
        let StoreError::Corrupt { what } = &error else {
            panic!("expected Corrupt, got {error:?}");
        };
        for name in names {
            assert!(what.contains(name), "`{what}` names {name}");
        }
        for id in ["wf", "other"] {
            still_running(store, id).await;
            assert_eq!(journal(store, id).await, pairs(&[]), "{id}");
        }
        assert_eq!(store.load_journal("wf", 1).await.unwrap(), []);
    }
    // Alone, too.
    let bad = [(step("other", 0, "\"x\""), StepTiming::default())];
    let error = store
        .finish_after_steps(&[completed("wf")], &[None], &[&bad])
        .await
        .expect_err("a row of another instance is refused");
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error:?}");
    still_running(store, "wf").await;
    assert_eq!(journal(store, "other").await, pairs(&[]));
}

fn finish_request(id: &str) -> FinishRequest {
    let Finish {
        generation,
        owner,
        status,
        output,
        error,
        ..
    } = completed(id);
    FinishRequest {
        id: id.to_owned(),
        generation,
        owner: owner.to_owned(),
        status,
        output: output.map(str::to_owned),
        error: error.map(str::to_owned),
    }
}

async fn the_writer_commits_rows_and_finish_together(db: &TestDb) {
    let store = &db.store;
    for id in ["alone", "left", "right", "lost"] {
        create_flow(db, id, None, None).await;
    }
    let writer = JournalWriter::spawn(store.clone());
    let started = now_us();
    let outcome = writer
        .finish_after_steps(
            finish_request("alone"),
            None,
            vec![
                (step("alone", 0, "\"a0\""), timing(2, started)),
                (step("alone", 1, "\"a1\""), StepTiming::default()),
            ],
        )
        .await
        .unwrap();
    assert!(matches!(outcome, (true, None)), "{outcome:?}");
    finished(store, "alone").await;
    let entries = store.load_journal_entries("alone", 0).await.unwrap();
    let seen: Vec<(i64, Option<u32>, Option<i64>)> = entries
        .iter()
        .map(|e| (e.row.seq, e.attempts, e.started_at))
        .collect();
    assert_eq!(seen, [(0, Some(2), Some(started)), (1, None, None)]);

    // Two at once, for different instances: both apply, each with its rows.
    let run = |id: &'static str| {
        let writer = writer.clone();
        tokio::spawn(async move {
            let rows = (0..3)
                .map(|seq| (step(id, seq, &format!("{seq}")), StepTiming::default()))
                .collect();
            writer
                .finish_after_steps(finish_request(id), None, rows)
                .await
        })
    };
    let (left, right) = tokio::join!(run("left"), run("right"));
    for (id, outcome) in [("left", left), ("right", right)] {
        let outcome = outcome.expect("the finish task panicked").unwrap();
        assert!(matches!(outcome, (true, None)), "{id}: {outcome:?}");
        finished(store, id).await;
        assert_eq!(
            journal(store, id).await,
            pairs(&[(0, "0"), (1, "1"), (2, "2")]),
            "{id}"
        );
    }

    // Through the writer too, a row journaled first with another result
    // stops the finish.
    store
        .append_steps(&[step("lost", 0, "\"theirs\"")])
        .await
        .unwrap();
    let outcome = writer
        .finish_after_steps(
            finish_request("lost"),
            None,
            vec![(step("lost", 0, "\"ours\""), StepTiming::default())],
        )
        .await
        .unwrap();
    assert!(matches!(outcome, (false, None)), "{outcome:?}");
    still_running(store, "lost").await;
    assert_eq!(journal(store, "lost").await, pairs(&[(0, "\"theirs\"")]));
}

/// On PostgreSQL a lone end without a parent and its rows are one statement,
/// not a transaction of several: triggers record each write's
/// `statement_timestamp()`, and the rows and the end share one. A second
/// end, of a child, goes through the transaction instead (its statements
/// differ), which shows the check can tell the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_lone_end_and_its_rows_are_one_statement() {
    let db = TestDb::postgres().await;
    let pool = db.pg_pool();
    sqlx::raw_sql(
        "CREATE TABLE written (what text, workflow text, at timestamptz); \
         CREATE FUNCTION note_step() RETURNS trigger AS $$ BEGIN \
         INSERT INTO written VALUES ('step', NEW.workflow_id, statement_timestamp()); \
         RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE FUNCTION note_end() RETURNS trigger AS $$ BEGIN \
         INSERT INTO written VALUES ('end', NEW.id, statement_timestamp()); \
         RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER note_step AFTER INSERT ON keiro.steps FOR EACH ROW \
         EXECUTE FUNCTION note_step(); \
         CREATE TRIGGER note_end AFTER UPDATE OF status ON keiro.workflows FOR EACH ROW \
         WHEN (NEW.status = 'completed') EXECUTE FUNCTION note_end()",
    )
    .execute(pool)
    .await
    .unwrap();
    let store = &db.store;
    create_flow(&db, "lone", None, None).await;
    create_flow(&db, "parent", None, None).await;
    create_flow(&db, "child", Some("parent"), None).await;
    for id in ["lone", "child"] {
        let rows = [
            (step(id, 0, "\"a\""), StepTiming::default()),
            (step(id, 1, "\"b\""), StepTiming::default()),
        ];
        let outcome = store
            .finish_after_steps(&[completed(id)], &[None], &[&rows])
            .await
            .unwrap();
        assert!(matches!(outcome.as_slice(), [(true, None)]), "{outcome:?}");
    }
    let statements = |id: &'static str| {
        sqlx::query_scalar::<_, i64>("SELECT count(DISTINCT at) FROM written WHERE workflow = $1")
            .bind(id)
            .fetch_one(pool)
    };
    assert_eq!(statements("lone").await.unwrap(), 1, "the lone end");
    assert_eq!(statements("child").await.unwrap(), 2, "the child's end");
}

/// Step rows `seqs` of `id`, each with result `"<tag><seq>"`, as a chain.
fn chain(id: &str, seqs: std::ops::Range<i64>, tag: &str) -> Vec<(StepRow, StepTiming)> {
    seqs.map(|seq| {
        (
            step(id, seq, &format!("\"{tag}{seq}\"")),
            StepTiming::default(),
        )
    })
    .collect()
}

async fn a_chain_is_recorded_whole(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    let started = now_us() - 1_000_000;
    let rows = [
        (step("wf", 0, "\"a\""), timing(2, started)),
        (step("wf", 1, "\"b\""), StepTiming::default()),
        (step("wf", 2, "\"c\""), timing(1, started + 500)),
    ];
    let outcomes = store.append_chains(&[&rows]).await.unwrap();
    assert_eq!(outcomes, [vec![AppendOutcome::Inserted; 3]]);
    journaled_as(store, "wf", &rows).await;
    // A lone row is a chain too, and an empty chain records nothing.
    let lone = chain("wf", 3..4, "d");
    let outcomes = store.append_chains(&[&lone, &[]]).await.unwrap();
    assert_eq!(outcomes, [vec![AppendOutcome::Inserted], vec![]]);
    let outcomes = store.append_chains(&[&lone]).await.unwrap();
    assert_eq!(outcomes, [vec![AppendOutcome::Existing(lone[0].0.clone())]]);
    assert_eq!(
        journal(store, "wf").await,
        pairs(&[(0, "\"a\""), (1, "\"b\""), (2, "\"c\""), (3, "\"d3\"")])
    );
}

async fn a_chain_stops_at_a_row_journaled_first(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    // Another executor, which took the instance over, journaled step 2
    // first; this run's steps 3 and 4 may have used its own step 2.
    let theirs = step("wf", 2, "\"theirs\"");
    store
        .append_steps(std::slice::from_ref(&theirs))
        .await
        .unwrap();
    let ours = chain("wf", 0..5, "ours");
    let outcomes = store.append_chains(&[&ours]).await.unwrap();
    assert_eq!(
        outcomes,
        [vec![
            AppendOutcome::Inserted,
            AppendOutcome::Inserted,
            AppendOutcome::Existing(theirs.clone()),
        ]]
    );
    assert_eq!(
        journal(store, "wf").await,
        pairs(&[(0, "\"ours0\""), (1, "\"ours1\""), (2, "\"theirs\"")])
    );
    // Stopped at its first row, a chain records nothing, even a row after a
    // gap; the same holds with the same result (a batch is written once, so
    // a row found journaled is never this run's own).
    let again = [
        (theirs.clone(), StepTiming::default()),
        (step("wf", 7, "\"late\""), StepTiming::default()),
    ];
    let outcomes = store.append_chains(&[&again]).await.unwrap();
    assert_eq!(outcomes, [vec![AppendOutcome::Existing(theirs)]]);
    assert_eq!(journal(store, "wf").await.len(), 3);
}

async fn each_chain_of_a_batch_stands_or_falls_alone(db: &TestDb) {
    let store = &db.store;
    for id in ["left", "lost", "right"] {
        create_flow(db, id, None, None).await;
    }
    store
        .append_steps(&[step("lost", 1, "\"theirs\"")])
        .await
        .unwrap();
    let (left, lost, right) = (
        chain("left", 0..3, "l"),
        chain("lost", 0..3, "x"),
        chain("right", 0..2, "r"),
    );
    let outcomes = store.append_chains(&[&left, &lost, &right]).await.unwrap();
    assert_eq!(
        outcomes,
        [
            vec![AppendOutcome::Inserted; 3],
            vec![
                AppendOutcome::Inserted,
                AppendOutcome::Existing(step("lost", 1, "\"theirs\"")),
            ],
            vec![AppendOutcome::Inserted; 2],
        ]
    );
    assert_eq!(
        journal(store, "left").await,
        pairs(&[(0, "\"l0\""), (1, "\"l1\""), (2, "\"l2\"")])
    );
    assert_eq!(
        journal(store, "lost").await,
        pairs(&[(0, "\"x0\""), (1, "\"theirs\"")])
    );
    assert_eq!(
        journal(store, "right").await,
        pairs(&[(0, "\"r0\""), (1, "\"r1\"")])
    );
}

async fn two_chains_of_one_run_in_one_call_do_not_mix(db: &TestDb) {
    let store = &db.store;
    create_flow(db, "wf", None, None).await;
    // Two runs of one instance (a run that lost its lease and the one that
    // took over) whose chains meet in one call: the first written wins, and
    // the second stops at the row they share.
    let first = chain("wf", 0..2, "a");
    let second = chain("wf", 1..3, "b");
    let outcomes = store.append_chains(&[&first, &second]).await.unwrap();
    assert_eq!(
        outcomes,
        [
            vec![AppendOutcome::Inserted; 2],
            vec![AppendOutcome::Existing(first[1].0.clone())],
        ]
    );
    assert_eq!(
        journal(store, "wf").await,
        pairs(&[(0, "\"a0\""), (1, "\"a1\"")])
    );
}

async fn a_malformed_chain_is_refused_before_anything_is_written(db: &TestDb) {
    let store = &db.store;
    for id in ["one", "two"] {
        create_flow(db, id, None, None).await;
    }
    let fine = chain("one", 0..2, "f");
    let mixed = [
        (step("two", 0, "\"t\""), StepTiming::default()),
        (step("one", 2, "\"o\""), StepTiming::default()),
    ];
    let error = store.append_chains(&[&fine, &mixed]).await.unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error:?}");
    let message = error.to_string();
    for named in ["`one`", "`two`", "one chain"] {
        assert!(message.contains(named), "{message}");
    }
    // Nor another generation of the same instance.
    let generations = [
        (step("one", 0, "\"g0\""), StepTiming::default()),
        (
            StepRow {
                generation: 1,
                ..step("one", 1, "\"g1\"")
            },
            StepTiming::default(),
        ),
    ];
    let error = store.append_chains(&[&generations]).await.unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error:?}");
    // Nor one step twice.
    let twice = [chain("one", 0..2, "a"), chain("one", 1..2, "b")].concat();
    let error = store.append_chains(&[&twice]).await.unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error:?}");
    assert!(error.to_string().contains("one step twice"), "{error}");
    for id in ["one", "two"] {
        assert_eq!(journal(store, id).await, pairs(&[]), "{id}");
    }
}

async fn the_writer_records_chains(db: &TestDb) {
    let store = &db.store;
    for id in ["left", "right", "lost"] {
        create_flow(db, id, None, None).await;
    }
    let writer = JournalWriter::spawn(store.clone());
    // Two at once, of different instances: each recorded whole.
    let run = |id: &'static str| {
        let writer = writer.clone();
        tokio::spawn(async move { writer.append_chain(chain(id, 0..3, id)).await })
    };
    let (left, right) = tokio::join!(run("left"), run("right"));
    for (id, outcome) in [("left", left), ("right", right)] {
        let outcomes = outcome.expect("the chain's task panicked").unwrap();
        assert_eq!(outcomes, vec![AppendOutcome::Inserted; 3], "{id}");
        assert_eq!(journal(store, id).await.len(), 3, "{id}");
    }
    // One that meets a row journaled first stops there.
    let theirs = step("lost", 0, "\"theirs\"");
    store
        .append_steps(std::slice::from_ref(&theirs))
        .await
        .unwrap();
    let outcomes = writer
        .append_chain(chain("lost", 0..3, "ours"))
        .await
        .unwrap();
    assert_eq!(outcomes, [AppendOutcome::Existing(theirs)]);
    assert_eq!(journal(store, "lost").await, pairs(&[(0, "\"theirs\"")]));
}
