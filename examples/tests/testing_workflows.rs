//! The README's "Testing workflows", runnable: `cargo test -p keiro-examples
//! --test testing_workflows`.
//!
//! A three-day approval workflow tested in milliseconds on a virtual clock,
//! and a journal kept as a fixture (`tests/histories/`) replayed against the
//! current code, so `cargo test` catches a change that would break the
//! instances in flight.

use std::time::{Duration, Instant};

use keiro::testing::{replay, TestEnv};
use keiro::{step, workflow, History};

const DAY: Duration = Duration::from_secs(86_400);

#[step]
async fn notify_reviewer(order: String) -> Result<(), String> {
    println!("  asked a reviewer about {order}");
    Ok(())
}

#[step]
async fn ship(order: String) -> Result<String, String> {
    Ok(format!("{order} shipped"))
}

/// Waits three days, asks a reviewer, then gives them one day to approve.
#[workflow]
async fn approval(order: String) -> Result<String, String> {
    keiro::sleep(3 * DAY).await;
    notify_reviewer(order.clone()).await?;
    let answer = keiro::recv::<bool>("approved")
        .timeout(DAY)
        .await
        .map_err(|e| e.to_string())?;
    match answer {
        Some(true) => ship(order).await,
        Some(false) => Ok(format!("{order} rejected")),
        None => Ok(format!("{order} expired")),
    }
}

#[tokio::test]
async fn nobody_answers_so_the_order_expires() {
    let wall = Instant::now();
    let env = TestEnv::new().await;
    let started = env.now();
    let order = env
        .start(approval("order-1".into()).id("order-1"))
        .await
        .unwrap();
    env.advance(3 * DAY).await; // the sleep ends, the reviewer is asked
    env.advance(DAY).await; // the recv times out
    assert_eq!(order.result().await.unwrap(), Ok("order-1 expired".into()));
    assert_eq!(env.now().duration_since(started).unwrap(), 4 * DAY);
    assert!(
        wall.elapsed() < Duration::from_secs(1),
        "{:?}",
        wall.elapsed()
    );
}

#[tokio::test]
async fn an_approval_within_the_day_ships() {
    let env = TestEnv::new().await;
    let order = env
        .start(approval("order-2".into()).id("order-2"))
        .await
        .unwrap();
    env.advance(3 * DAY + Duration::from_secs(3_600)).await;
    env.keiro()
        .send("order-2", "approved", &true)
        .await
        .unwrap();
    assert_eq!(order.result().await.unwrap(), Ok("order-2 shipped".into()));
}

#[tokio::test]
async fn run_skips_the_waits_by_itself() {
    let env = TestEnv::new().await;
    let outcome = env
        .run(approval("order-3".into()).id("order-3"))
        .await
        .unwrap();
    assert_eq!(outcome, Ok("order-3 expired".into()));
}

/// `tests/histories/order-4.json` is the journal of an instance that was
/// asked and is waiting for its answer (`keiro show order-4 --history`).
/// Replaying it against the current `approval` passes; a change that
/// inserted a step before `notify_reviewer` would fail here with the
/// expected/found diff, before any deploy.
#[tokio::test]
async fn the_code_still_replays_a_recorded_history() {
    let text = include_str!("histories/order-4.json");
    let history = History::from_json(text).unwrap();
    let replayed = replay(&history, approval).await.unwrap();
    // Every recorded entry met as recorded; the code then waits for the
    // answer, where the instance in production goes on.
    assert_eq!((replayed.matched, replayed.entries), (3, 3));
    assert_eq!(replayed.stop, keiro::ReplayStop::HistoryEnd);
}
