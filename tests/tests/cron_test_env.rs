//! A `TestEnv` fires the cron ticks that fall within `advance`, in order,
//! on its virtual clock.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro::testing::TestEnv;

static TICKS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

#[keiro::workflow(cron = "*/2 * * * * *")]
async fn every_two_seconds(scheduled_at: SystemTime) -> Result<(), String> {
    let secs = scheduled_at
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    note(secs).await
}

#[keiro::step]
async fn note(secs: u64) -> Result<(), String> {
    TICKS.lock().unwrap().push(secs);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advance_fires_the_ticks_within_it_in_order() {
    // 2023-11-14T22:13:20.5Z, half a second past an even second.
    let start = UNIX_EPOCH + Duration::from_millis(1_700_000_000_500);
    let env = TestEnv::starting_at(start).await;
    env.advance(Duration::from_secs(7)).await;
    assert_eq!(
        *TICKS.lock().unwrap(),
        [1_700_000_002, 1_700_000_004, 1_700_000_006]
    );
    let listed = env.keiro().schedules().await.unwrap();
    let last = listed[0].last_tick.unwrap();
    assert_eq!(last, UNIX_EPOCH + Duration::from_secs(1_700_000_006));
    assert_eq!(
        listed[0].next_tick,
        Some(UNIX_EPOCH + Duration::from_secs(1_700_000_008))
    );
}
