//! Cron on a `TestEnv`'s clock, moved by hand:
//! - a scheduler held up for longer than a minute (a suspended machine, a
//!   store out of reach) treats the ticks that fell meanwhile as missed
//!   ticks, as at start-up: by default only the latest of them runs, then
//!   every tick of the last minute, in order; never the oldest hundred
//!   instead of the newest;
//! - triggers while the clock stands still each run.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro::testing::TestEnv;
use keiro::ListFilter;

#[keiro::workflow(cron = "*/1 * * * * *")]
async fn each_second(scheduled_at: SystemTime) -> Result<(), String> {
    scheduled_at
        .duration_since(UNIX_EPOCH)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The tick seconds of the instances `each_second`'s schedule made, in
/// order.
async fn ticks(env: &TestEnv) -> Vec<i64> {
    ticks_of(env, "each_second").await
}

/// The tick seconds of the instances schedule `name` made, in order.
async fn ticks_of(env: &TestEnv, name: &str) -> Vec<i64> {
    let prefix = format!("cron:{name}:");
    let page = env
        .keiro()
        .list(&ListFilter::default().id_prefix(&prefix).limit(1000))
        .await
        .unwrap();
    let mut ticks: Vec<i64> = page
        .items
        .iter()
        .map(|row| {
            let at = row.id.trim_start_matches(&prefix);
            chrono::DateTime::parse_from_rfc3339(at)
                .unwrap_or_else(|e| panic!("{}: {e}", row.id))
                .timestamp()
        })
        .collect();
    ticks.sort_unstable();
    ticks
}

/// A test environment whose clock starts half a second past `start`, a
/// whole second (returned with it).
async fn half_past_a_second() -> (i64, TestEnv) {
    let start: i64 = 1_700_000_000;
    let at = UNIX_EPOCH + Duration::from_millis(start as u64 * 1000 + 500);
    (start, TestEnv::starting_at(at).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_runs_the_latest_missed_tick_and_the_last_minute() {
    let (start, env) = half_past_a_second().await;
    env.advance(Duration::from_secs(3)).await;
    assert_eq!(ticks(&env).await, [start + 1, start + 2, start + 3]);

    // Two hours pass at once, without a pass of the scheduler.
    let stalled_until = start + 3 + 7200;
    keiro::unstable::raw_store(env.keiro())
        .clock()
        .set_us((stalled_until * 1000 + 500) * 1000);
    env.advance(Duration::from_millis(1)).await;

    let ran = ticks(&env).await;
    // Missed: everything up to a minute before now; the latest of it runs.
    let latest_missed = stalled_until - 60;
    let mut expected = vec![start + 1, start + 2, start + 3, latest_missed];
    expected.extend(latest_missed + 1..=stalled_until);
    assert_eq!(
        ran.len(),
        expected.len(),
        "ran {} ticks, from {:?} to {:?}",
        ran.len(),
        ran.get(3),
        ran.last()
    );
    assert_eq!(ran, expected);
}

#[keiro::workflow]
async fn greet(name: String) -> Result<String, String> {
    Ok(format!("hello {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_at_one_instant_each_run() {
    let env = TestEnv::starting_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000)).await;
    let keiro = env.keiro();
    keiro
        .create_schedule("greet-daily", "0 0 9 * * *", greet("ada".into()))
        .await
        .unwrap();
    let first = keiro.trigger_schedule("greet-daily").await.unwrap();
    let second = keiro.trigger_schedule("greet-daily").await.unwrap();
    assert_eq!(first, "cron:greet-daily:trigger:2023-11-14T22:13:20Z");
    assert_eq!(second, format!("{first}-2"));
    for id in [first, second] {
        let handle = keiro.handle::<Result<String, String>>(&id).await.unwrap();
        env.advance(Duration::from_millis(1)).await;
        assert_eq!(handle.result().await.unwrap(), Ok("hello ada".to_owned()));
    }
}

/// A schedule made by another process while this worker's scheduler was
/// held up for more than a minute, first read after the hold-up: the ticks
/// since its making are missed ticks (the latest of those more than a
/// minute late runs, then every tick of the last minute), as a worker
/// starting then would run them, not only those of the last minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_made_during_a_hold_up_runs_its_missed_tick() {
    let (start, env) = half_past_a_second().await;
    env.advance(Duration::from_secs(1)).await;
    let store = keiro::unstable::raw_store(env.keiro());
    // Held up: the clock moves on with no pass of the scheduler, and
    // another process makes a schedule ticking at each whole minute.
    let made = start + 3_600;
    store.clock().set_us(made * 1_000_000 + 500_000);
    store
        .put_schedule(&keiro_store::ScheduleDef {
            name: "minutely",
            cron: "0 * * * * *",
            timezone: "UTC",
            workflow: "greet",
            input: Some("[\"bo\"]"),
            latest_tick: None,
        })
        .await
        .unwrap();
    // 150 s after the making the scheduler passes again: two whole
    // minutes fell since, one more than a minute ago.
    store.clock().set_us((made + 150) * 1_000_000 + 500_000);
    env.advance(Duration::from_millis(1)).await;
    let ran = ticks_of(&env, "minutely").await;
    let minutes: Vec<i64> = (made + 1..=made + 150).filter(|t| t % 60 == 0).collect();
    assert_eq!(minutes.len(), 2, "{minutes:?}");
    // The latest of those more than a minute late, and the last minute's.
    let late = made + 150 - 60;
    let latest_missed = *minutes.iter().rfind(|&&t| t <= late).unwrap();
    let mut expected = vec![latest_missed];
    expected.extend(minutes.iter().filter(|&&t| t > late));
    assert_eq!(ran, expected, "made at {made}, minutes {minutes:?}");
}
