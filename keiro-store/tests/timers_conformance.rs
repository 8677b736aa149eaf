//! The timer storage conformance suite, run against both backends.
//!
//! Every case is an `async fn(&TestDb)`; `conformance!` at the top runs each
//! one as `sqlite::<case>` on a fresh SQLite file and as `postgres::<case>` on a
//! fresh PostgreSQL database. Times are explicit (microseconds), so nothing
//! here sleeps.

#[macro_use]
mod support;

use std::collections::{BTreeSet, HashMap};

use keiro_store::{
    NewTimer, ReasonMatch, ResumeClaimOutcome, ResumeUpdate, ScheduleOutcome, Store, TimerListKind,
    TimerQuery, TimerRow, TimerStatus, TimerUpdate,
};
use support::TestDb;

/// Runs `$body` once, on the test store's own backend, with `$pool` its
/// connection pool and `$begin` the statement its write transactions begin
/// with (SQLite's `BEGIN IMMEDIATE` takes the write lock at once).
macro_rules! on_pool {
    ($db:expr, |$pool:ident, $begin:ident| $body:expr) => {
        match &$db.store {
            Store::Sqlite(s) => {
                let ($pool, $begin) = (s.pool(), "BEGIN IMMEDIATE");
                $body
            }
            Store::Postgres(p) => {
                let ($pool, $begin) = (p.pool(), "BEGIN");
                $body
            }
        }
    };
}

conformance!(
    schedule_creates_a_scheduled_timer,
    schedule_rearms_only_a_scheduled_timer,
    schedule_once_keeps_the_first,
    schedule_refuses_a_payload_that_is_not_json,
    schedule_in_the_callers_transaction_follows_it,
    cancel_in_the_callers_transaction_follows_it,
    claim_takes_the_earliest_due_and_counts_attempts,
    claim_breaks_fire_time_ties_by_id,
    mark_fired_applies_only_to_a_firing_timer,
    requeue_stuck_moves_only_claims_at_least_that_old,
    requeue_one_keeps_attempts_of_a_claim_and_resets_a_dead_one,
    reschedule_moves_a_claimed_timer_in_one_call,
    cancel_ends_scheduled_firing_and_dead_timers_only,
    dead_letter_keeps_attempts_and_records_the_reason,
    pending_pages_visit_every_timer_once,
    pages_stay_stable_under_inserts,
    stuck_and_dead_listings_filter_and_page,
    resume_claim_holds_a_dead_timer_against_everyone_else,
    resume_complete_park_and_cancel_end_the_claim,
    expired_resume_claims_recover_to_dead,
    concurrent_claimers_each_get_distinct_timers,
);

// ---------------------------------------------------------------------------
// Helpers

const PM: &str = "billing";

fn timer(id: &str, fire_at: i64) -> NewTimer<'_> {
    NewTimer {
        id,
        process_manager: PM,
        correlation_id: "order-1",
        fire_at,
        payload: r#"{"n":1}"#,
    }
}

async fn schedule(db: &TestDb, id: &str, fire_at: i64) {
    let outcome = db.store.schedule_timer(&timer(id, fire_at)).await.unwrap();
    assert_eq!(outcome, ScheduleOutcome::Created, "`{id}` should be new");
}

async fn get(db: &TestDb, id: &str) -> TimerRow {
    db.store
        .get_timer(id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("timer `{id}` should exist"))
}

fn applied(update: TimerUpdate) -> TimerRow {
    match update {
        TimerUpdate::Applied(row) => row,
        other => panic!("expected the update to apply, got {other:?}"),
    }
}

fn resumed(update: ResumeUpdate) -> TimerRow {
    match update {
        ResumeUpdate::Applied(row) => row,
        other => panic!("expected the resume operation to apply, got {other:?}"),
    }
}

async fn claim(db: &TestDb, now: i64) -> TimerRow {
    db.store
        .claim_due_timer(now)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("a timer should be due at {now}"))
}

/// Schedules `id` due at 0, claims it at `now` and dead-letters it.
async fn dead(db: &TestDb, id: &str, now: i64, reason: &str) -> TimerRow {
    schedule(db, id, 0).await;
    let claimed = claim(db, now).await;
    assert_eq!(claimed.id, id);
    applied(db.store.dead_letter_timer(id, reason).await.unwrap())
}

fn query(kind: TimerListKind, limit: i64) -> TimerQuery<'static> {
    TimerQuery {
        kind,
        process_manager: None,
        reason: None,
        after: None,
        limit,
    }
}

/// Pages through `base` with `limit` rows a page, calling `between` after
/// each page, and returns every id seen in order.
async fn page_through(
    db: &TestDb,
    base: TimerQuery<'_>,
    mut between: impl FnMut(usize) -> Option<(String, i64)>,
) -> Vec<String> {
    let mut seen = Vec::new();
    let mut after: Option<(i64, String)> = None;
    for page in 0.. {
        let q = TimerQuery {
            after: after.as_ref().map(|(k, id)| (*k, id.as_str())),
            ..base
        };
        let rows = db.store.find_timers(&q).await.unwrap();
        assert!(rows.len() as i64 <= base.limit);
        if let Some(last) = rows.last() {
            after = Some((
                keiro_store::timer_sort_key(base.kind, last),
                last.id.clone(),
            ));
        }
        seen.extend(rows.iter().map(|r| r.id.clone()));
        if (rows.len() as i64) < base.limit {
            break;
        }
        if let Some((id, fire_at)) = between(page) {
            schedule(db, &id, fire_at).await;
        }
    }
    seen
}

// ---------------------------------------------------------------------------
// Scheduling

async fn schedule_creates_a_scheduled_timer(db: &TestDb) {
    let before = keiro_store::now_us();
    schedule(db, "t-1", 1_000).await;
    let row = get(db, "t-1").await;
    assert_eq!(row.id, "t-1");
    assert_eq!(row.process_manager, PM);
    assert_eq!(row.correlation_id, "order-1");
    assert_eq!(row.fire_at, 1_000);
    assert_eq!(row.payload, r#"{"n":1}"#);
    assert_eq!(row.status, TimerStatus::Scheduled);
    assert_eq!(row.attempts, 0);
    assert_eq!(
        (row.last_error, row.event_id, row.claimed_at),
        (None, None, None)
    );
    assert_eq!(row.resume_lease_until, None);
    assert!(row.created_at >= before && row.updated_at == row.created_at);
    assert_eq!(db.store.get_timer("missing").await.unwrap(), None);
}

async fn schedule_rearms_only_a_scheduled_timer(db: &TestDb) {
    schedule(db, "t-1", 1_000).await;
    let moved = NewTimer {
        correlation_id: "order-2",
        payload: r#"{"n":2}"#,
        ..timer("t-1", 2_000)
    };
    assert_eq!(
        db.store.schedule_timer(&moved).await.unwrap(),
        ScheduleOutcome::Updated
    );
    let row = get(db, "t-1").await;
    assert_eq!(
        (
            row.fire_at,
            row.correlation_id.as_str(),
            row.payload.as_str()
        ),
        (2_000, "order-2", r#"{"n":2}"#)
    );

    claim(db, 2_000).await;
    let again = db.store.schedule_timer(&timer("t-1", 9_000)).await.unwrap();
    assert_eq!(again, ScheduleOutcome::Unchanged(TimerStatus::Firing));
    let row = get(db, "t-1").await;
    assert_eq!((row.status, row.fire_at), (TimerStatus::Firing, 2_000));
}

async fn schedule_once_keeps_the_first(db: &TestDb) {
    assert!(db
        .store
        .schedule_timer_once(&timer("t-1", 1_000))
        .await
        .unwrap());
    let second = NewTimer {
        payload: r#"{"n":2}"#,
        ..timer("t-1", 5_000)
    };
    assert!(!db.store.schedule_timer_once(&second).await.unwrap());
    let row = get(db, "t-1").await;
    assert_eq!((row.fire_at, row.payload.as_str()), (1_000, r#"{"n":1}"#));
}

async fn schedule_refuses_a_payload_that_is_not_json(db: &TestDb) {
    let bad = NewTimer {
        payload: "not json",
        ..timer("t-1", 1_000)
    };
    let error = db.store.schedule_timer(&bad).await.unwrap_err();
    assert!(
        error.to_string().contains("schedule_timer"),
        "the error names the operation: {error}"
    );
    assert_eq!(db.store.get_timer("t-1").await.unwrap(), None);
}

async fn schedule_in_the_callers_transaction_follows_it(db: &TestDb) {
    on_pool!(db, |pool, begin| {
        let mut tx = pool.begin_with(begin).await.unwrap();
        let created =
            keiro_store::schedule_timer_tx(&mut tx, &timer("rolled-back", 1), db.store.now_us())
                .await
                .unwrap();
        assert_eq!(created, ScheduleOutcome::Created);
        tx.rollback().await.unwrap();

        let mut tx = pool.begin_with(begin).await.unwrap();
        keiro_store::schedule_timer_tx(&mut tx, &timer("committed", 1), STAMP)
            .await
            .unwrap();
        assert!(!keiro_store::schedule_timer_once_tx(
            &mut tx,
            &timer("committed", 2),
            db.store.now_us()
        )
        .await
        .unwrap());
        tx.commit().await.unwrap();
    });
    assert_eq!(db.store.get_timer("rolled-back").await.unwrap(), None);
    let committed = get(db, "committed").await;
    assert_eq!(committed.fire_at, 1);
    assert_eq!(
        (committed.created_at, committed.updated_at),
        (STAMP, STAMP),
        "stamped at the time given"
    );
}

/// A time far from the store's clock, as the `now` of a write in the
/// caller's transaction.
const STAMP: i64 = 1_234_567;

async fn cancel_in_the_callers_transaction_follows_it(db: &TestDb) {
    schedule(db, "t-1", 1_000).await;
    for commit in [false, true] {
        let update = on_pool!(db, |pool, begin| {
            let mut tx = pool.begin_with(begin).await.unwrap();
            let update = keiro_store::cancel_timer_tx(&mut tx, "t-1", STAMP)
                .await
                .unwrap();
            if commit {
                tx.commit().await.unwrap()
            } else {
                tx.rollback().await.unwrap()
            }
            update
        });
        assert_eq!(applied(update).status, TimerStatus::Cancelled);
        let expected = if commit {
            TimerStatus::Cancelled
        } else {
            TimerStatus::Scheduled
        };
        assert_eq!(get(db, "t-1").await.status, expected);
    }
    assert_eq!(
        get(db, "t-1").await.updated_at,
        STAMP,
        "stamped at the time given"
    );
}

// ---------------------------------------------------------------------------
// Claiming and firing

async fn claim_takes_the_earliest_due_and_counts_attempts(db: &TestDb) {
    assert_eq!(db.store.next_timer_fire_at().await.unwrap(), None);
    schedule(db, "late", 100).await;
    schedule(db, "early", 50).await;
    schedule(db, "future", 1_000).await;
    assert_eq!(db.store.count_due_timers(500).await.unwrap(), 2);
    assert_eq!(db.store.next_timer_fire_at().await.unwrap(), Some(50));

    let first = claim(db, 500).await;
    assert_eq!(first.id, "early");
    assert_eq!(first.status, TimerStatus::Firing);
    assert_eq!(first.attempts, 1);
    assert_eq!(first.claimed_at, Some(500));
    assert_eq!(
        get(db, "early").await,
        first,
        "the claim returns the stored row"
    );

    assert_eq!(db.store.next_timer_fire_at().await.unwrap(), Some(100));
    assert_eq!(claim(db, 500).await.id, "late");
    assert_eq!(db.store.claim_due_timer(500).await.unwrap(), None);
    assert_eq!(db.store.count_due_timers(500).await.unwrap(), 0);
    assert_eq!(db.store.count_due_timers(1_000).await.unwrap(), 1);
    assert_eq!(claim(db, 1_000).await.id, "future");
}

async fn claim_breaks_fire_time_ties_by_id(db: &TestDb) {
    for id in ["c", "a", "b"] {
        schedule(db, id, 10).await;
    }
    let mut order = Vec::new();
    while let Some(row) = db.store.claim_due_timer(10).await.unwrap() {
        order.push(row.id);
    }
    assert_eq!(order, ["a", "b", "c"]);
}

async fn mark_fired_applies_only_to_a_firing_timer(db: &TestDb) {
    schedule(db, "t-1", 0).await;
    assert_eq!(
        db.store.mark_timer_fired("t-1", "ev-1").await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Scheduled)
    );
    claim(db, 10).await;
    let fired = applied(db.store.mark_timer_fired("t-1", "ev-1").await.unwrap());
    assert_eq!(fired.status, TimerStatus::Fired);
    assert_eq!(fired.event_id.as_deref(), Some("ev-1"));
    assert_eq!(fired.attempts, 1);
    assert_eq!(
        db.store.mark_timer_fired("t-1", "ev-2").await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Fired)
    );
    assert_eq!(get(db, "t-1").await.event_id.as_deref(), Some("ev-1"));
    assert_eq!(
        db.store.mark_timer_fired("missing", "ev").await.unwrap(),
        TimerUpdate::Missing
    );
}

// ---------------------------------------------------------------------------
// Recovery

async fn requeue_stuck_moves_only_claims_at_least_that_old(db: &TestDb) {
    schedule(db, "old", 0).await;
    schedule(db, "new", 0).await;
    let other = NewTimer {
        process_manager: "shipping",
        ..timer("other-pm", 0)
    };
    db.store.schedule_timer(&other).await.unwrap();
    assert_eq!(claim(db, 1_000).await.id, "new");
    assert_eq!(claim(db, 1_000).await.id, "old");
    assert_eq!(claim(db, 2_000).await.id, "other-pm");

    assert_eq!(db.store.count_stuck_timers(999, None).await.unwrap(), 0);
    assert_eq!(db.store.count_stuck_timers(1_000, None).await.unwrap(), 2);
    assert_eq!(db.store.count_stuck_timers(2_000, None).await.unwrap(), 3);
    assert_eq!(
        db.store
            .count_stuck_timers(2_000, Some("shipping"))
            .await
            .unwrap(),
        1
    );

    assert_eq!(db.store.requeue_stuck_timers(999).await.unwrap(), 0);
    assert_eq!(db.store.requeue_stuck_timers(1_000).await.unwrap(), 2);
    for id in ["old", "new"] {
        let row = get(db, id).await;
        assert_eq!((row.status, row.attempts), (TimerStatus::Scheduled, 1));
    }
    assert_eq!(get(db, "other-pm").await.status, TimerStatus::Firing);
    let again = claim(db, 3_000).await;
    assert_eq!((again.id.as_str(), again.attempts), ("new", 2));
}

async fn requeue_one_keeps_attempts_of_a_claim_and_resets_a_dead_one(db: &TestDb) {
    dead(db, "dead", 20, "gave up").await;
    schedule(db, "claimed", 0).await;
    claim(db, 10).await;
    let row = applied(db.store.requeue_timer("claimed").await.unwrap());
    assert_eq!((row.status, row.attempts), (TimerStatus::Scheduled, 1));
    assert_eq!(
        db.store.requeue_timer("claimed").await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Scheduled)
    );

    let row = applied(db.store.requeue_timer("dead").await.unwrap());
    assert_eq!((row.status, row.attempts), (TimerStatus::Scheduled, 0));
    assert_eq!(
        row.last_error.as_deref(),
        Some("gave up"),
        "kept for the record"
    );
    assert_eq!(
        db.store.requeue_timer("missing").await.unwrap(),
        TimerUpdate::Missing
    );
}

async fn reschedule_moves_a_claimed_timer_in_one_call(db: &TestDb) {
    schedule(db, "t-1", 0).await;
    claim(db, 100).await;
    let row = applied(
        db.store
            .reschedule_timer("t-1", 5_000, Some("upstream busy"))
            .await
            .unwrap(),
    );
    assert_eq!(row.status, TimerStatus::Scheduled);
    assert_eq!(row.fire_at, 5_000);
    assert_eq!(row.attempts, 1, "the ceiling counts every claim");
    assert_eq!(row.last_error.as_deref(), Some("upstream busy"));
    assert_eq!(db.store.claim_due_timer(4_999).await.unwrap(), None);
    assert_eq!(claim(db, 5_000).await.attempts, 2);

    // A scheduled timer can be moved too; a note-less move keeps the old note.
    applied(db.store.reschedule_timer("t-1", 6_000, None).await.unwrap());
    let row = applied(db.store.reschedule_timer("t-1", 7_000, None).await.unwrap());
    assert_eq!(
        (row.fire_at, row.last_error.as_deref()),
        (7_000, Some("upstream busy"))
    );

    claim(db, 7_000).await;
    db.store.mark_timer_fired("t-1", "ev").await.unwrap();
    assert_eq!(
        db.store.reschedule_timer("t-1", 9_000, None).await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Fired)
    );
}

async fn cancel_ends_scheduled_firing_and_dead_timers_only(db: &TestDb) {
    schedule(db, "scheduled", 1_000_000).await;
    schedule(db, "firing", 0).await;
    claim(db, 10).await;
    dead(db, "dead", 20, "boom").await;
    schedule(db, "fired", 0).await;
    claim(db, 30).await;
    db.store.mark_timer_fired("fired", "ev").await.unwrap();

    for id in ["scheduled", "firing", "dead"] {
        let row = applied(db.store.cancel_timer(id).await.unwrap());
        assert_eq!(row.status, TimerStatus::Cancelled, "{id}");
    }
    assert_eq!(
        db.store.cancel_timer("fired").await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Fired)
    );
    assert_eq!(
        db.store.cancel_timer("dead").await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Cancelled)
    );
    assert_eq!(
        db.store.cancel_timer("missing").await.unwrap(),
        TimerUpdate::Missing
    );
    assert_eq!(db.store.claim_due_timer(i64::MAX).await.unwrap(), None);
}

async fn dead_letter_keeps_attempts_and_records_the_reason(db: &TestDb) {
    schedule(db, "t-1", 0).await;
    claim(db, 10).await;
    db.store.requeue_timer("t-1").await.unwrap();
    claim(db, 20).await;
    let row = applied(
        db.store
            .dead_letter_timer("t-1", "payload is malformed")
            .await
            .unwrap(),
    );
    assert_eq!(row.status, TimerStatus::Dead);
    assert_eq!(row.attempts, 2);
    assert_eq!(row.last_error.as_deref(), Some("payload is malformed"));
    assert_eq!(
        db.store.dead_letter_timer("t-1", "again").await.unwrap(),
        TimerUpdate::NotApplicable(TimerStatus::Dead)
    );
    // A scheduled timer can be dead-lettered before it is ever claimed.
    schedule(db, "t-2", 1_000_000).await;
    let row = applied(db.store.dead_letter_timer("t-2", "obsolete").await.unwrap());
    assert_eq!((row.status, row.attempts), (TimerStatus::Dead, 0));
}

// ---------------------------------------------------------------------------
// Inspection

async fn pending_pages_visit_every_timer_once(db: &TestDb) {
    let mut expected = Vec::new();
    for i in 0..23 {
        // Four timers share each fire time, so ties are paged by id.
        let id = format!("t-{i:02}");
        schedule(db, &id, 100 + (i / 4) as i64).await;
        expected.push(id);
    }
    let seen = page_through(
        db,
        query(TimerListKind::Pending { due_by: None }, 5),
        |_| None,
    )
    .await;
    assert_eq!(
        seen, expected,
        "every pending timer once, in (fire_at, id) order"
    );

    let due = db
        .store
        .find_timers(&query(TimerListKind::Pending { due_by: Some(101) }, 100))
        .await
        .unwrap();
    assert_eq!(due.len(), 8);

    claim(db, 1_000).await;
    let seen = page_through(
        db,
        query(TimerListKind::Pending { due_by: None }, 100),
        |_| None,
    )
    .await;
    assert_eq!(seen.len(), 22, "a claimed timer is no longer pending");
}

async fn pages_stay_stable_under_inserts(db: &TestDb) {
    let mut expected = BTreeSet::new();
    for i in 0..30 {
        let id = format!("t-{i:02}");
        schedule(db, &id, 1_000 + i as i64 * 10).await;
        expected.insert(id);
    }
    // Between pages, one timer lands before the cursor and one after it.
    let mut inserted = Vec::new();
    let seen = page_through(
        db,
        query(TimerListKind::Pending { due_by: None }, 4),
        |page| {
            let (id, at) = if page % 2 == 0 {
                (format!("early-{page}"), 0)
            } else {
                (format!("late-{page}"), 5_000 + page as i64)
            };
            inserted.push(id.clone());
            Some((id, at))
        },
    )
    .await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &seen {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    assert!(
        counts.values().all(|&n| n == 1),
        "no timer is seen twice: {seen:?}"
    );
    for id in &expected {
        assert_eq!(counts.get(id.as_str()), Some(&1), "`{id}` seen once");
    }
    for id in inserted.iter().filter(|id| id.starts_with("late-")) {
        assert!(
            counts.contains_key(id.as_str()),
            "`{id}` sorts after the cursor and is seen"
        );
    }
    assert!(
        !inserted
            .iter()
            .any(|id| id.starts_with("early-") && counts.contains_key(id.as_str())),
        "rows landing before the cursor are not picked up mid-walk"
    );
}

async fn stuck_and_dead_listings_filter_and_page(db: &TestDb) {
    for i in 0..6 {
        let id = format!("stuck-{i}");
        let pm = if i % 2 == 0 { PM } else { "shipping" };
        db.store
            .schedule_timer(&NewTimer {
                process_manager: pm,
                ..timer(&id, 0)
            })
            .await
            .unwrap();
        claim(db, 100 + i as i64).await;
    }
    let stuck = page_through(
        db,
        query(TimerListKind::Stuck { claimed_by: 103 }, 2),
        |_| None,
    )
    .await;
    assert_eq!(stuck, ["stuck-0", "stuck-1", "stuck-2", "stuck-3"]);
    let shipping = db
        .store
        .find_timers(&TimerQuery {
            process_manager: Some("shipping"),
            ..query(TimerListKind::Stuck { claimed_by: 1_000 }, 10)
        })
        .await
        .unwrap();
    let ids: Vec<&str> = shipping.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["stuck-1", "stuck-3", "stuck-5"]);

    for (i, reason) in [
        "attempt ceiling of 3 exceeded",
        "payload is malformed",
        "attempt ceiling of 5 exceeded",
    ]
    .into_iter()
    .enumerate()
    {
        dead(db, &format!("dead-{i}"), 200, reason).await;
    }
    let all_dead = page_through(db, query(TimerListKind::Dead, 2), |_| None).await;
    assert_eq!(all_dead.len(), 3);
    let ceiling = db
        .store
        .find_timers(&TimerQuery {
            reason: Some(ReasonMatch::Contains("attempt ceiling")),
            ..query(TimerListKind::Dead, 10)
        })
        .await
        .unwrap();
    let ids: BTreeSet<&str> = ceiling.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["dead-0", "dead-2"]));
    let exact = db
        .store
        .find_timers(&TimerQuery {
            reason: Some(ReasonMatch::Exact("payload is malformed")),
            ..query(TimerListKind::Dead, 10)
        })
        .await
        .unwrap();
    assert_eq!(exact.len(), 1);
    assert_eq!(exact[0].id, "dead-1");
    // A `%` is literal text, not a pattern.
    let none = db
        .store
        .find_timers(&TimerQuery {
            reason: Some(ReasonMatch::Contains("%")),
            ..query(TimerListKind::Dead, 10)
        })
        .await
        .unwrap();
    assert!(none.is_empty());
}

// ---------------------------------------------------------------------------
// Guarded foreground resume

async fn resume_claim_holds_a_dead_timer_against_everyone_else(db: &TestDb) {
    schedule(db, "live", 1_000_000).await;
    assert_eq!(
        db.store
            .claim_dead_timer("live", "tok", 2_000, 1_000)
            .await
            .unwrap(),
        ResumeClaimOutcome::NotDead(TimerStatus::Scheduled)
    );
    assert_eq!(
        db.store
            .claim_dead_timer("missing", "tok", 2_000, 1_000)
            .await
            .unwrap(),
        ResumeClaimOutcome::Missing
    );
    db.store.cancel_timer("live").await.unwrap();

    let dead_row = dead(db, "t-1", 500, "handler refused").await;
    let ResumeClaimOutcome::Claimed(row) = db
        .store
        .claim_dead_timer("t-1", "tok-a", 2_000, 1_000)
        .await
        .unwrap()
    else {
        panic!("a dead timer can be claimed")
    };
    assert_eq!(row.status, TimerStatus::Resuming);
    assert_eq!(row.resume_lease_until, Some(2_000));
    assert_eq!(row.attempts, dead_row.attempts);
    assert_eq!(row.last_error.as_deref(), Some("handler refused"));

    assert_eq!(
        db.store
            .claim_dead_timer("t-1", "tok-b", 3_000, 1_500)
            .await
            .unwrap(),
        ResumeClaimOutcome::Held { lease_until: 2_000 }
    );
    let guarded = TimerUpdate::Guarded { lease_until: 2_000 };
    assert_eq!(db.store.cancel_timer("t-1").await.unwrap(), guarded);
    assert_eq!(db.store.requeue_timer("t-1").await.unwrap(), guarded);
    assert_eq!(
        db.store.reschedule_timer("t-1", 0, None).await.unwrap(),
        guarded
    );
    assert_eq!(
        db.store.dead_letter_timer("t-1", "x").await.unwrap(),
        guarded
    );
    assert_eq!(
        db.store.mark_timer_fired("t-1", "ev").await.unwrap(),
        guarded
    );
    assert_eq!(db.store.requeue_stuck_timers(i64::MAX).await.unwrap(), 0);
    assert_eq!(db.store.claim_due_timer(i64::MAX).await.unwrap(), None);

    let update = db
        .store
        .renew_timer_resume("t-1", "tok-b", 5_000, 1_500)
        .await;
    assert_eq!(
        update.unwrap(),
        ResumeUpdate::Lost(Some(TimerStatus::Resuming)),
        "a wrong token is refused"
    );
    let renewed = resumed(
        db.store
            .renew_timer_resume("t-1", "tok-a", 5_000, 1_500)
            .await
            .unwrap(),
    );
    assert_eq!(renewed.resume_lease_until, Some(5_000));
    assert_eq!(
        db.store.cancel_timer("t-1").await.unwrap(),
        TimerUpdate::Guarded { lease_until: 5_000 }
    );
    // Past the renewed lease the claim is lost even before recovery runs.
    let update = db
        .store
        .complete_timer_resume("t-1", "tok-a", "ev", 5_000)
        .await;
    assert_eq!(
        update.unwrap(),
        ResumeUpdate::Lost(Some(TimerStatus::Resuming))
    );
    let update = db
        .store
        .renew_timer_resume("missing", "tok-a", 5_000, 1_500)
        .await;
    assert_eq!(update.unwrap(), ResumeUpdate::Lost(None));
}

async fn resume_complete_park_and_cancel_end_the_claim(db: &TestDb) {
    for id in ["complete", "park", "park-keep", "cancel"] {
        dead(db, id, 100, "original reason").await;
        let claimed = db
            .store
            .claim_dead_timer(id, &format!("tok-{id}"), 10_000, 1_000)
            .await
            .unwrap();
        assert!(matches!(claimed, ResumeClaimOutcome::Claimed(_)), "{id}");
    }

    let row = resumed(
        db.store
            .complete_timer_resume("complete", "tok-complete", "ev-7", 2_000)
            .await
            .unwrap(),
    );
    assert_eq!(row.status, TimerStatus::Fired);
    assert_eq!(row.event_id.as_deref(), Some("ev-7"));
    assert_eq!(row.resume_lease_until, None);

    let row = resumed(
        db.store
            .park_timer_resume("park", "tok-park", Some("waiting on the customer"), 2_000)
            .await
            .unwrap(),
    );
    assert_eq!(row.status, TimerStatus::Dead);
    assert_eq!(row.last_error.as_deref(), Some("waiting on the customer"));
    assert_eq!((row.attempts, row.resume_lease_until), (1, None));
    let row = resumed(
        db.store
            .park_timer_resume("park-keep", "tok-park-keep", None, 2_000)
            .await
            .unwrap(),
    );
    assert_eq!(
        (row.status, row.last_error.as_deref()),
        (TimerStatus::Dead, Some("original reason"))
    );

    let row = resumed(
        db.store
            .cancel_timer_resume("cancel", "tok-cancel", 2_000)
            .await
            .unwrap(),
    );
    assert_eq!(row.status, TimerStatus::Cancelled);

    // The token is spent: nothing it does applies any more.
    let update = db
        .store
        .cancel_timer_resume("complete", "tok-complete", 2_000)
        .await;
    assert_eq!(
        update.unwrap(),
        ResumeUpdate::Lost(Some(TimerStatus::Fired))
    );
    let update = db
        .store
        .renew_timer_resume("park", "tok-park", 20_000, 2_000)
        .await;
    assert_eq!(update.unwrap(), ResumeUpdate::Lost(Some(TimerStatus::Dead)));
    // A parked timer is dead again: it can be claimed anew.
    assert!(matches!(
        db.store
            .claim_dead_timer("park", "tok-2", 10_000, 3_000)
            .await
            .unwrap(),
        ResumeClaimOutcome::Claimed(_)
    ));
}

async fn expired_resume_claims_recover_to_dead(db: &TestDb) {
    let before = dead(db, "t-1", 100, "handler refused").await;
    dead(db, "t-2", 100, "other").await;
    db.store
        .claim_dead_timer("t-1", "tok-1", 2_000, 1_000)
        .await
        .unwrap();
    db.store
        .claim_dead_timer("t-2", "tok-2", 9_000, 1_000)
        .await
        .unwrap();

    assert_eq!(
        db.store.recover_expired_timer_resumes(1_999).await.unwrap(),
        0
    );
    assert_eq!(
        db.store.recover_expired_timer_resumes(2_000).await.unwrap(),
        1
    );
    let row = get(db, "t-1").await;
    assert_eq!(row.status, TimerStatus::Dead);
    assert_eq!(row.last_error, before.last_error, "the reason is kept");
    assert_eq!(row.attempts, before.attempts, "the attempts are kept");
    assert_eq!(row.resume_lease_until, None);
    assert_eq!(get(db, "t-2").await.status, TimerStatus::Resuming);
    let update = db
        .store
        .complete_timer_resume("t-1", "tok-1", "ev", 1_500)
        .await;
    assert_eq!(
        update.unwrap(),
        ResumeUpdate::Lost(Some(TimerStatus::Dead)),
        "a recovered claim's token no longer applies"
    );

    // A lapsed claim can also be taken over directly, before any sweep.
    let ResumeClaimOutcome::Claimed(row) = db
        .store
        .claim_dead_timer("t-2", "tok-3", 20_000, 9_000)
        .await
        .unwrap()
    else {
        panic!("a lapsed claim can be taken over")
    };
    assert_eq!(row.resume_lease_until, Some(20_000));
    let update = db
        .store
        .renew_timer_resume("t-2", "tok-2", 30_000, 9_000)
        .await;
    assert_eq!(
        update.unwrap(),
        ResumeUpdate::Lost(Some(TimerStatus::Resuming))
    );
}

// ---------------------------------------------------------------------------
// Concurrency

async fn concurrent_claimers_each_get_distinct_timers(db: &TestDb) {
    const TIMERS: usize = 200;
    for i in 0..TIMERS {
        schedule(db, &format!("t-{i:03}"), i as i64).await;
    }
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let store = db.second_store().await;
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Some(row) = store.claim_due_timer(1_000).await.unwrap() {
                mine.push(row.id);
            }
            store.close().await;
            mine
        }));
    }
    let mut all = Vec::new();
    for claimer in claimers {
        all.extend(claimer.await.unwrap());
    }
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(all.len(), TIMERS, "every timer claimed once");
    assert_eq!(distinct.len(), TIMERS);
}

// ---------------------------------------------------------------------------
// PostgreSQL: schedules wake sleeping workers in every process

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schedules_notify_workers_on_commit() {
    let db = TestDb::postgres().await;
    let Store::Postgres(pg) = &db.store else {
        unreachable!()
    };
    let mut listener = pg.listen_timers().await.unwrap();
    let quiet = std::time::Duration::from_millis(300);

    let mut tx = db.pg_pool().begin().await.unwrap();
    keiro_store::schedule_timer_tx(&mut tx, &timer("t-1", 10), db.store.now_us())
        .await
        .unwrap();
    keiro_store::schedule_timer_tx(&mut tx, &timer("t-2", 20), db.store.now_us())
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(quiet, listener.recv()).await.is_err(),
        "nothing is announced before the commit"
    );
    tx.commit().await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification after the commit")
        .unwrap();

    // Leaving a timer as it is announces nothing.
    assert!(!db
        .store
        .schedule_timer_once(&timer("t-1", 99))
        .await
        .unwrap());
    assert!(tokio::time::timeout(quiet, listener.recv()).await.is_err());
    db.finish().await;
}
