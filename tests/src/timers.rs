//! What the `timers_*` tests share: a `Timers` handle on a test database,
//! timer requests already due, scheduling that must create, and a fire action
//! that counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use keiro::timers::{
    schedule_tx, FireOutcome, ScheduleOutcome, TimerChange, TimerId, TimerRequest, TimerRow,
    TimerWorkerOptions, Timers,
};

use crate::TestDb;

/// The process manager of the timers [`past`] makes.
pub const PM: &str = "checkout";

/// A `Timers` handle with its own pool on `db`.
pub async fn timers(db: &TestDb) -> Timers {
    Timers::connect(&db.url).await.unwrap_or_else(|e| {
        panic!(
            "connect timers to {}: {e}",
            keiro_store::redact_url(&db.url)
        )
    })
}

/// A request for timer `id` of [`PM`], correlation `order-<id>`, due a second
/// ago.
pub fn past(id: &str) -> TimerRequest {
    TimerRequest::new(
        id,
        PM,
        format!("order-{id}"),
        SystemTime::now() - Duration::from_secs(1),
    )
}

/// Schedules `request`, asserting that it creates a new timer.
pub async fn schedule(timers: &Timers, request: TimerRequest) {
    let outcome = timers.schedule(&request).await.unwrap();
    assert_eq!(
        outcome,
        ScheduleOutcome::Created,
        "{} should be new",
        request.id
    );
}

/// The stored row of timer `id`, which must exist.
pub async fn row(timers: &Timers, id: &str) -> TimerRow {
    timers
        .get(&TimerId::new(id))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("timer `{id}` should exist"))
}

/// The store's own pool, to begin a transaction for the `*_tx` functions.
pub enum Pool<'a> {
    /// The SQLite pool.
    Sqlite(&'a sqlx::SqlitePool),
    /// The PostgreSQL pool.
    Postgres(&'a sqlx::PgPool),
}

/// The pool of `timers`' store.
pub fn pool(timers: &Timers) -> Pool<'_> {
    let store = timers.store();
    match (store.sqlite_pool(), store.postgres_pool()) {
        (Some(pool), _) => Pool::Sqlite(pool),
        (_, Some(pool)) => Pool::Postgres(pool),
        (None, None) => unreachable!("a store is SQLite or PostgreSQL"),
    }
}

/// Runs `$body` (which uses `$tx`, a transaction on `$keiro`'s database)
/// and then commits when `$commit`, else rolls back; yields the body's value.
#[macro_export]
macro_rules! in_tx {
    ($keiro:expr, $commit:expr, |$tx:ident| $body:expr) => {{
        let timers = $keiro.timers();
        match $crate::timers::pool(&timers) {
            $crate::timers::Pool::Sqlite(s) => {
                let mut $tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
                let out = $body;
                if $commit {
                    $tx.commit().await.unwrap();
                } else {
                    $tx.rollback().await.unwrap();
                }
                out
            }
            $crate::timers::Pool::Postgres(p) => {
                let mut $tx = p.begin().await.unwrap();
                let out = $body;
                if $commit {
                    $tx.commit().await.unwrap();
                } else {
                    $tx.rollback().await.unwrap();
                }
                out
            }
        }
    }};
}

/// Schedules every request in one transaction of the store's own pool.
pub async fn schedule_all(timers: &Timers, requests: &[TimerRequest]) {
    match pool(timers) {
        Pool::Sqlite(s) => {
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            for request in requests {
                schedule_tx(&mut tx, request).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.unwrap();
            for request in requests {
                schedule_tx(&mut tx, request).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
}

/// A fire action that completes every timer and counts fires per id.
pub fn counting(
    counts: &Arc<Mutex<HashMap<String, usize>>>,
) -> impl Fn(TimerRow) -> std::future::Ready<FireOutcome> + Send + Sync + 'static {
    let counts = counts.clone();
    move |timer: TimerRow| {
        *counts
            .lock()
            .unwrap()
            .entry(timer.id.to_string())
            .or_default() += 1;
        std::future::ready(FireOutcome::completed(format!("ev-{}", timer.id)))
    }
}

/// Worker options with no attempt ceiling and no requeue of stale claims.
pub fn no_requeue() -> TimerWorkerOptions {
    TimerWorkerOptions::default()
        .max_attempts(None)
        .requeue_stuck_after(None)
}

/// Schedules timer `id` due now, claims it and dead-letters it with `reason`;
/// returns the dead row.
pub async fn dead(timers: &Timers, id: &str, reason: &str) -> TimerRow {
    schedule(timers, past(id)).await;
    let claimed = timers.claim_due().await.unwrap().expect("due");
    assert_eq!(claimed.id.as_str(), id);
    match timers.dead_letter(&claimed.id, reason).await.unwrap() {
        TimerChange::Applied(row) => row,
        other => panic!("dead-letter {id}: {other:?}"),
    }
}
