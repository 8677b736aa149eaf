//! Cron schedules: each tick runs exactly once across two worker processes,
//! at once in the process that created it; pause, resume, trigger and
//! backfill; dynamic schedules; missed ticks; the listing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keiro::{Keiro, ListFilter, MissedTicks, ResumeOptions, WorkflowStatus};
use keiro_tests::process::CrashChild;
use keiro_tests::{Backend, TestDb};

/// Ticks every second.
#[keiro::workflow(cron = "*/1 * * * * *")]
async fn every_second(scheduled_at: SystemTime) -> Result<u64, String> {
    Ok(scheduled_at
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs())
}

/// Ticks at 02:00 in Berlin: never during a test, so its instances are the
/// ones the test makes.
#[keiro::workflow(cron = "0 0 2 * * *", timezone = "Europe/Berlin")]
async fn nightly_report(scheduled_at: SystemTime) -> Result<SystemTime, String> {
    Ok(scheduled_at)
}

/// Keeps a resume pass busy for 8 s.
#[keiro::workflow]
async fn slow_step() -> Result<(), String> {
    nap().await
}

#[keiro::step]
async fn nap() -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs(8)).await;
    Ok(())
}

/// The workflow of the dynamic schedules.
#[keiro::workflow]
async fn greet(name: String) -> Result<String, String> {
    Ok(format!("hello {name}"))
}

async fn ids(keiro: &Keiro, prefix: &str) -> Vec<String> {
    let page = keiro
        .list(&ListFilter::default().id_prefix(prefix).limit(1000))
        .await
        .expect("list");
    let mut ids: Vec<_> = page.items.into_iter().map(|row| row.id).collect();
    ids.sort();
    ids
}

async fn worker(keiro: &Keiro) -> keiro::ResumeWorker {
    worker_with(keiro, ResumeOptions::default()).await
}

/// A resume worker with `options`, polling every 50 ms.
async fn worker_with(keiro: &Keiro, options: ResumeOptions) -> keiro::ResumeWorker {
    keiro
        .resume_worker(options.poll_interval(Duration::from_millis(50)))
        .await
        .expect("start a resume worker")
}

async fn two_worker_processes_run_every_tick_exactly_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await; // migrates
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let effects_arg = effects.to_str().unwrap();
    let binary = env!("CARGO_BIN_EXE_cron_worker");
    let mut a = CrashChild::start(binary, &db, "cron-a", &[effects_arg], None);
    let mut b = CrashChild::start(binary, &db, "cron-b", &[effects_arg], None);
    // Both workers (and their schedulers) are serving before the window
    // opens, so every tick in it is raced for by two processes.
    for child in [&mut a, &mut b] {
        child.line_containing("keiro resume worker serves").await;
    }
    let started = SystemTime::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stopped = SystemTime::now();
    assert!(
        a.is_running() && b.is_running(),
        "both workers serve until the end of the window"
    );
    a.kill().await;
    b.kill().await;

    let mut runs: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for line in keiro_tests::process::lines_of(&effects) {
        let (tick, pid) = line.split_once(' ').expect("`<tick> <pid>`");
        runs.entry(tick.parse().unwrap())
            .or_default()
            .push(pid.to_owned());
    }
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    // The first whole second after both serve; a tick in the last second may
    // still be running when they are killed.
    let (first, last) = (secs(started) + 1, secs(stopped) - 2);
    for tick in first..=last {
        assert_eq!(
            runs.get(&tick).map(Vec::len),
            Some(1),
            "tick {tick} must run exactly once between {first} and {last}: {runs:?}"
        );
    }
    for (tick, pids) in &runs {
        assert_eq!(pids.len(), 1, "tick {tick} ran more than once: {pids:?}");
    }
    // Which of the two wins a tick is a race (on SQLite one process may win
    // them all); that both were serving throughout is asserted above.
    let pids: std::collections::BTreeSet<_> = runs.values().flatten().collect();
    assert!(!pids.is_empty(), "no worker ran a tick: {runs:?}");
    let instances = ids(&keiro, "cron:cron_tick:").await;
    assert!(
        instances.len() >= (last - first + 1) as usize,
        "{instances:?}"
    );
}

async fn pause_stops_ticks_and_resume_restarts_them(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker(&keiro).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        ids(&keiro, "cron:every_second:").await.len() >= 2,
        "ticks run every second"
    );
    keiro.pause_schedule("every_second").await.unwrap();
    let listed = keiro.schedules().await.unwrap();
    let info = listed.iter().find(|s| s.name == "every_second").unwrap();
    assert!(
        info.paused && info.next_tick.is_none() && !info.dynamic,
        "{info:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused = ids(&keiro, "cron:every_second:").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        ids(&keiro, "cron:every_second:").await,
        paused,
        "no tick while paused"
    );

    keiro.resume_schedule("every_second").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let resumed = ids(&keiro, "cron:every_second:").await;
    assert!(
        resumed.len() >= paused.len() + 2,
        "{paused:?} then {resumed:?}"
    );
    worker.stop().await;
}

async fn trigger_and_backfill_run_each_tick_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker(&keiro).await;

    let id = keiro.trigger_schedule("nightly_report").await.unwrap();
    assert!(id.starts_with("cron:nightly_report:trigger:"), "{id}");
    let handle = keiro
        .handle::<Result<SystemTime, String>>(&id)
        .await
        .unwrap();
    handle.result().await.unwrap().unwrap();

    // 2024-01-10T00:00:00Z to 2024-01-15T00:00:00Z: five ticks at 01:00Z.
    let from = UNIX_EPOCH + Duration::from_secs(1_704_844_800);
    let to = from + Duration::from_secs(5 * 86_400);
    let created = keiro
        .backfill_schedule("nightly_report", from, to)
        .await
        .unwrap();
    assert_eq!(
        created,
        (10..15)
            .map(|day| format!("cron:nightly_report:2024-01-{day}T01:00:00Z"))
            .collect::<Vec<_>>()
    );
    for id in &created {
        let handle = keiro
            .handle::<Result<SystemTime, String>>(id)
            .await
            .unwrap();
        let ran_for = handle.result().await.unwrap().unwrap();
        assert!(ran_for >= from && ran_for <= to, "{id}: {ran_for:?}");
    }
    let again = keiro
        .backfill_schedule("nightly_report", from, to)
        .await
        .unwrap();
    assert!(again.is_empty(), "a second backfill adds none: {again:?}");
    assert_eq!(ids(&keiro, "cron:nightly_report:2024").await, created);
    // A tick's instance records the creating runtime's application version
    // and the workflow's skeleton hash, like any other new instance.
    let ticks = keiro
        .list(&ListFilter::default().id_prefix("cron:nightly_report:"))
        .await
        .unwrap()
        .items;
    assert_eq!(ticks.len(), created.len() + 1, "{ticks:?}");
    for tick in &ticks {
        assert_eq!(
            tick.version.as_deref(),
            Some(keiro.app_version()),
            "{tick:?}"
        );
        assert!(tick.skeleton_hash.is_some(), "{tick:?}");
    }

    let err = keiro
        .trigger_schedule("no_such_schedule")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`no_such_schedule`") && text.contains("nightly_report"),
        "{text}"
    );
    assert!(
        matches!(err, keiro::Error::UnknownSchedule { .. }),
        "{err:?}"
    );
    worker.stop().await;
}

async fn dynamic_schedules_are_created_listed_and_deleted(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let worker = worker(&keiro).await;
    keiro
        .create_schedule("greet-ada", "*/1 * * * * *", greet("Ada".into()))
        .await
        .unwrap();
    let listed = keiro.schedules().await.unwrap();
    let info = listed.iter().find(|s| s.name == "greet-ada").unwrap();
    assert!(
        info.dynamic && !info.paused && info.next_tick.is_some(),
        "{info:?}"
    );
    assert_eq!(
        (info.workflow.as_str(), info.timezone.as_str()),
        ("greet", "UTC")
    );
    let nightly = listed.iter().find(|s| s.name == "nightly_report").unwrap();
    assert_eq!(
        (nightly.cron.as_str(), nightly.timezone.as_str()),
        ("0 0 2 * * *", "Europe/Berlin")
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let ids = ids(&keiro, "cron:greet-ada:").await;
        if ids.len() >= 2 || Instant::now() > deadline {
            break ids;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(first.len() >= 2, "the dynamic schedule ticks: {first:?}");
    let handle = keiro
        .handle::<Result<String, String>>(&first[0])
        .await
        .unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok("hello Ada".to_owned()));

    keiro.delete_schedule("greet-ada").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = ids(&keiro, "cron:greet-ada:").await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        ids(&keiro, "cron:greet-ada:").await,
        deleted,
        "no tick after delete"
    );
    assert!(keiro
        .schedules()
        .await
        .unwrap()
        .iter()
        .all(|s| s.name != "greet-ada"));

    let err = keiro.delete_schedule("greet-ada").await.unwrap_err();
    assert!(err.to_string().contains("`greet-ada`"), "{err}");
    let err = keiro.delete_schedule("nightly_report").await.unwrap_err();
    assert!(
        matches!(err, keiro::Error::InvalidSchedule { .. }),
        "{err:?}"
    );
    let err = keiro
        .create_schedule("bad", "every day", greet("x".into()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`every day`"), "{err}");
    // Settings a schedule would not keep are refused, not dropped; nothing
    // is stored.
    let refused = [
        (
            greet("x".into()).queue(&keiro_tests::queues::ONE_AT_A_TIME),
            "queue settings",
        ),
        (greet("x".into()).priority(1), "queue settings"),
        (
            greet("x".into()).debounce("k", Duration::from_secs(1)),
            "`.debounce(..)`",
        ),
        (
            greet("x".into()).timeout(Duration::from_secs(1)),
            "`.timeout(..)`",
        ),
    ];
    for (call, what) in refused {
        let err = keiro
            .create_schedule("dropped", "*/1 * * * * *", call)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, keiro::Error::InvalidOption { .. })
                && text.contains(what)
                && text.contains("`dropped`")
                && text.contains("`greet`"),
            "{text}"
        );
    }
    assert!(!keiro
        .schedules()
        .await
        .unwrap()
        .iter()
        .any(|s| s.name == "dropped"));
    worker.stop().await;
    let statuses: Vec<_> = keiro
        .list(&ListFilter::default().id_prefix("cron:greet-ada:"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|row| row.status)
        .collect();
    assert!(
        statuses.contains(&WorkflowStatus::Completed),
        "{statuses:?}"
    );
}

async fn a_tick_runs_at_once_without_waiting_for_a_pass(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // The worker's first pass claims `slow` and waits for it: no other pass
    // runs while it does, so a tick that completes meanwhile was driven by
    // the scheduler that created it.
    let slow = slow_step().on(&keiro).id("slow").enqueue().await.unwrap();
    let worker = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let completed = loop {
        let done: Vec<_> = keiro
            .list(&ListFilter::default().id_prefix("cron:every_second:"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|row| row.status == WorkflowStatus::Completed)
            .collect();
        if done.len() >= 2 || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        completed.len() >= 2,
        "ticks complete between passes: {completed:?}"
    );
    for row in &completed {
        let lag = row
            .updated_at
            .duration_since(UNIX_EPOCH + Duration::from_secs(tick_of(&row.id) as u64))
            .unwrap();
        assert!(
            lag < Duration::from_secs(1),
            "{} ended {lag:?} after its tick",
            row.id
        );
    }
    let slow_status = keiro.summary(slow.id()).await.unwrap().status;
    assert_eq!(slow_status, WorkflowStatus::Running, "the pass was busy");
    worker.stop().await;
}

/// A tick is run in one of the worker's `concurrency` slots: while a worker
/// of concurrency 1 runs another instance, its ticks wait, pending, and run
/// once the slot frees.
async fn a_tick_waits_for_a_slot_of_a_full_worker(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let slow = slow_step().on(&keiro).id("slow").enqueue().await.unwrap();
    let worker = worker_with(&keiro, ResumeOptions::default().concurrency(1)).await;
    // From when `slow` holds the slot: a tick that fell before may have
    // run in it, or been claimed beside `slow` by the same pass.
    let deadline = Instant::now() + Duration::from_secs(30);
    while keiro.summary(slow.id()).await.unwrap().status != WorkflowStatus::Running {
        assert!(Instant::now() < deadline, "slow never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held_since = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let waiting: Vec<_> = keiro
        .list(&ListFilter::default().id_prefix("cron:every_second:"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|row| row.created_at > held_since)
        .collect();
    let slow_status = keiro.summary(slow.id()).await.unwrap().status;
    assert_eq!(slow_status, WorkflowStatus::Running, "the slot is taken");
    assert!(!waiting.is_empty(), "ticks are created meanwhile");
    assert!(
        waiting
            .iter()
            .all(|row| row.status == WorkflowStatus::Pending),
        "no tick runs beside the run holding the only slot: {waiting:?}"
    );
    slow.result().await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    for row in &waiting {
        while keiro.summary(&row.id).await.unwrap().status != WorkflowStatus::Completed {
            assert!(
                Instant::now() < deadline,
                "{} runs once the slot frees",
                row.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    worker.stop().await;
}

/// The tick (seconds since the Unix epoch) of an `every_second` instance id.
fn tick_of(id: &str) -> i64 {
    let tick = id.strip_prefix("cron:every_second:").expect("a tick id");
    chrono::DateTime::parse_from_rfc3339(tick)
        .unwrap_or_else(|e| panic!("{id}: {e}"))
        .timestamp()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Starts a worker with `missed`, lets it run 1.5 s, stops it; returns the
/// ticks it created, the whole second it started in, and whether its first
/// pass surely fell within that second.
async fn restart(keiro: &Keiro, missed: MissedTicks) -> (Vec<i64>, i64, bool) {
    let before = ids(keiro, "cron:every_second:").await;
    let started = now_secs();
    let worker = keiro
        .resume_worker(ResumeOptions::default().missed_ticks(missed))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let same_second = now_secs() == started;
    tokio::time::sleep(Duration::from_millis(1400)).await;
    worker.stop().await;
    let new = ids(keiro, "cron:every_second:")
        .await
        .into_iter()
        .filter(|id| !before.contains(id))
        .map(|id| tick_of(&id))
        .collect();
    (new, started, same_second)
}

async fn missed_ticks_run_the_latest_once_or_none(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // A first worker ticks, so the schedule has a last tick.
    let first = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while ids(&keiro, "cron:every_second:").await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.stop().await;
    assert!(!ids(&keiro, "cron:every_second:").await.is_empty());

    // Skip: none of the ticks that fell while no worker ran.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (new, started, _) = restart(&keiro, MissedTicks::Skip).await;
    assert!(
        new.iter().all(|&tick| tick > started),
        "Skip ran a missed tick: {new:?} (started in second {started})"
    );

    // RunLatest (the default): the latest missed tick once, none before it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (new, started, same_second) = restart(&keiro, MissedTicks::default()).await;
    assert!(
        new.iter().all(|&tick| tick >= started),
        "only the latest missed tick runs: {new:?} (started in second {started})"
    );
    if same_second {
        assert!(
            new.contains(&started),
            "the latest missed tick ({started}) runs on start-up: {new:?}"
        );
    }
}

async fn backfill_refuses_a_future_or_reversed_range(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    // Ending after now: those ticks are the scheduler's, at their time.
    let err = keiro
        .backfill_schedule("nightly_report", now - day, now + 2 * day)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, keiro::Error::InvalidOption { .. })
            && text.contains("`nightly_report`")
            && text.contains("after now"),
        "{text}"
    );
    // Ending before it starts.
    let err = keiro
        .backfill_schedule("nightly_report", now - day, now - 3 * day)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, keiro::Error::InvalidOption { .. }) && text.contains("earlier time first"),
        "{text}"
    );
    assert!(ids(&keiro, "cron:nightly_report:").await.is_empty());
    let info = keiro.schedules().await.unwrap();
    let nightly = info.iter().find(|s| s.name == "nightly_report").unwrap();
    assert_eq!(nightly.last_tick, None, "{nightly:?}");
}

/// The tick (seconds since the Unix epoch) of an instance id with `prefix`.
fn tick_after(prefix: &str, id: &str) -> i64 {
    let tick = id.strip_prefix(prefix).expect("a tick id");
    chrono::DateTime::parse_from_rfc3339(tick)
        .unwrap_or_else(|e| panic!("{id}: {e}"))
        .timestamp()
}

/// Makes schedule `every4` (`*/4 * * * * *`) and runs a worker until one
/// of its ticks ran, so it has a last tick; then no worker runs.
async fn every4_with_a_last_tick(keiro: &Keiro) {
    keiro
        .create_schedule("every4", "*/4 * * * * *", greet("x".into()))
        .await
        .unwrap();
    let first = worker(keiro).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids(keiro, "cron:every4:").await.is_empty() {
        assert!(Instant::now() < deadline, "no tick of every4 ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.stop().await;
}

/// The ticks of `every4` that ran (its triggers left out), once the test
/// is checked to have stayed within the 4 s from tick `fell` to the next.
async fn every4_ticks_run(keiro: &Keiro, fell: i64) -> Vec<i64> {
    assert!(
        now_secs() < fell + 4,
        "the test overran the next tick; its window is 4 s"
    );
    ids(keiro, "cron:every4:")
        .await
        .iter()
        .filter(|id| !id.contains(":trigger:"))
        .map(|id| tick_after("cron:every4:", id))
        .collect()
}

/// Waits for the first tick of `every4` after second `since`; returns it.
async fn next_tick_of_every4(since: i64) -> i64 {
    loop {
        let now = now_secs();
        if now > since && now % 4 == 0 {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_tick_that_fell_while_paused_never_runs_after_a_resume(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    every4_with_a_last_tick(&keiro).await;
    keiro.pause_schedule("every4").await.unwrap();
    // Let a tick fall while paused, then resume right after it.
    let fell = next_tick_of_every4(now_secs()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    keiro.resume_schedule("every4").await.unwrap();
    // A worker starting now (missed ticks: run the latest) finds the tick
    // that fell while paused as the latest: it must pass it over.
    let second = worker(&keiro).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    second.stop().await;
    let ran = every4_ticks_run(&keiro, fell).await;
    assert!(
        !ran.contains(&fell),
        "tick {fell} fell while paused and ran after the resume: {ran:?}"
    );
    let info = keiro.schedules().await.unwrap();
    let every4 = info.iter().find(|s| s.name == "every4").unwrap();
    assert_eq!(
        every4.last_tick,
        Some(UNIX_EPOCH + Duration::from_secs(fell as u64)),
        "the passed-over tick is the last: {every4:?}"
    );
}

/// A schedule made while no worker runs, whose first tick falls before one
/// starts: that tick is missed like any other, so the worker runs it (the
/// default, run the latest), not only the ticks after it starts.
async fn a_new_schedules_first_tick_missed_runs_on_start_up(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // Made just after a tick, so the next one falls before the worker.
    let made = next_tick_of_every4(now_secs()).await;
    keiro
        .create_schedule("every4", "*/4 * * * * *", greet("x".into()))
        .await
        .unwrap();
    let fell = next_tick_of_every4(made).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while every4_ticks_run(&keiro, fell).await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    late.stop().await;
    let ran = every4_ticks_run(&keiro, fell).await;
    assert_eq!(ran, vec![fell], "the first tick, missed, ran once: {ran:?}");
    assert!(!ran.contains(&made), "a tick before the schedule ran");
}

/// A worker process whose binary does not link a schedule's workflow
/// leaves it to others and says so once (an operator who renamed the
/// workflow, or made the schedule where no worker serves it, learns why it
/// never ticks), not at every pass.
async fn a_schedule_no_workflow_here_serves_is_reported_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    keiro
        .create_schedule("elsewhere", "*/1 * * * * *", greet("x".into()))
        .await
        .unwrap();
    let id = format!("elsewhere-{}", uuid::Uuid::new_v4().simple());
    let mut child = CrashChild::start(env!("CARGO_BIN_EXE_queue_worker"), &db, &id, &[], None);
    let line = child.line_containing("leaves schedule").await;
    assert!(
        line.contains("`elsewhere`") && line.contains("workflow `greet`"),
        "{line}"
    );
    // Passes go on twice a second; the next such line is the next
    // schedule's, not this one again.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    keiro
        .create_schedule("elsewhere-2", "*/1 * * * * *", greet("y".into()))
        .await
        .unwrap();
    let line = child.line_containing("leaves schedule").await;
    assert!(line.contains("`elsewhere-2`"), "{line}");
    child.kill().await;
    assert!(ids(&keiro, "cron:elsewhere").await.is_empty());
}

/// A dynamic schedule made by another process (no worker of its own) just
/// before one of its ticks runs that tick: a worker that first sees it
/// after the tick starts it from the schedule's creation, not from then.
async fn a_schedule_made_elsewhere_just_before_a_tick_runs_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let running = worker(&keiro).await;
    let elsewhere = db.keiro().await;
    // 100 to 400 ms before a tick of `*/4` (the worker's passes come at
    // each whole second, for `every_second`, and half a second after), and
    // again at the next one should the making take longer than that.
    let tick = loop {
        let ms = now_ms();
        if !(3600..3900).contains(&(ms % 4000)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let tick = ms / 4000 * 4 + 4;
        elsewhere
            .create_schedule("elsewhere", "*/4 * * * * *", greet("x".into()))
            .await
            .unwrap();
        if now_secs() < tick {
            break tick;
        }
        elsewhere.delete_schedule("elsewhere").await.unwrap();
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    running.stop().await;
    let ran: Vec<i64> = ids(&keiro, "cron:elsewhere:")
        .await
        .iter()
        .map(|id| tick_after("cron:elsewhere:", id))
        .collect();
    assert!(ran.contains(&tick), "tick {tick} did not run: {ran:?}");
}

/// A worker draining its runs (`shutdown_within`) starts no tick meanwhile:
/// the ticks that fall while its last run finishes are left to other
/// workers.
async fn a_draining_worker_starts_no_tick(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    slow_step().on(&keiro).id("slow").enqueue().await.unwrap();
    let worker = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids(&keiro, "cron:every_second:").await.is_empty() {
        assert!(Instant::now() < deadline, "no tick ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let draining_from = now_ms();
    worker.shutdown_within(Duration::from_secs(3)).await;
    // (A tick within the first 200 ms may have been under way.)
    let after: Vec<i64> = ids(&db.keiro().await, "cron:every_second:")
        .await
        .iter()
        .map(|id| tick_of(id))
        .filter(|&tick| tick * 1000 > draining_from + 200)
        .collect();
    assert_eq!(after, Vec::<i64>::new(), "ticks started while draining");
}

/// A trigger runs the schedule once more, and is no tick: a tick that fell
/// while no worker ran is still run as missed by the next worker to start.
async fn a_trigger_does_not_pass_over_a_missed_tick(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    every4_with_a_last_tick(&keiro).await;
    let fell = next_tick_of_every4(now_secs()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let triggered = keiro.trigger_schedule("every4").await.unwrap();
    assert!(triggered.starts_with("cron:every4:trigger:"), "{triggered}");
    let second = worker(&keiro).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    second.stop().await;
    let ran = every4_ticks_run(&keiro, fell).await;
    assert!(
        ran.contains(&fell),
        "tick {fell}, missed, did not run after a trigger: {ran:?}"
    );
}

/// A tick that falls while paused is not run after a resume by a worker
/// that ran throughout (whose last pass may have come before the tick).
async fn a_running_worker_passes_over_a_tick_that_fell_while_paused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    every4_with_a_last_tick(&keiro).await;
    let running = worker(&keiro).await;
    // Its passes then come every half second, not at each whole second
    // (which would follow every tick of `every4` while paused).
    keiro.pause_schedule("every_second").await.unwrap();
    keiro.pause_schedule("every4").await.unwrap();
    let fell = next_tick_of_every4(now_secs()).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    keiro.resume_schedule("every4").await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    running.stop().await;
    let ran = every4_ticks_run(&keiro, fell).await;
    assert!(
        !ran.contains(&fell),
        "tick {fell} fell while paused and ran after the resume: {ran:?}"
    );
}

/// Changing a schedule's cron records the new definition's latest tick as
/// passed over: a worker starting afterwards does not run it as a tick
/// missed while no worker ran (it fell before the definition existed).
async fn a_redefined_schedule_runs_no_tick_of_before_its_change(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // Once a year, last run at the start of this year.
    keiro
        .create_schedule("redefined", "0 0 0 1 1 *", greet("x".into()))
        .await
        .unwrap();
    let now = now_secs();
    let year_start = now - now % 86_400 - 400 * 86_400;
    let store = keiro::unstable::raw_store(&keiro);
    store
        .record_schedule_tick("redefined", year_start * 1_000_000)
        .await
        .unwrap();
    // Now daily at midnight: today's midnight fell before the change.
    keiro
        .create_schedule("redefined", "0 0 0 * * *", greet("y".into()))
        .await
        .unwrap();
    let midnight = now - now % 86_400;
    let stored = store.schedule_named("redefined").await.unwrap().unwrap();
    assert_eq!(stored.last_tick, Some(midnight * 1_000_000));
    let started = worker(&keiro).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    started.stop().await;
    assert_eq!(ids(&keiro, "cron:redefined:").await, Vec::<String>::new());
}

/// Another workflow, holding the id of a tick of schedule `refilled`.
#[keiro::workflow]
async fn squatter() -> Result<(), String> {
    Ok(())
}

/// A backfill passes over a tick whose id another workflow's instance holds
/// (the schedule ran another workflow before it was made again) and starts
/// the range's other ticks, returning their ids.
async fn a_backfill_passes_over_a_tick_another_workflow_holds(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    keiro
        .create_schedule("refilled", "*/1 * * * * *", greet("x".into()))
        .await
        .unwrap();
    let base = now_secs() - 10;
    let tick_id = |secs: i64| {
        let at = chrono::DateTime::from_timestamp(secs, 0).unwrap();
        format!(
            "cron:refilled:{}",
            at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        )
    };
    squatter()
        .id(tick_id(base + 1))
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let from = UNIX_EPOCH + Duration::from_secs(base as u64);
    let created = keiro
        .backfill_schedule("refilled", from, from + Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(created, [tick_id(base), tick_id(base + 2)]);
}

/// A dynamic schedule deleted and made again with another definition
/// between two passes of a running scheduler (which then never sees it
/// gone, and no tick is recorded as passed over) runs no tick of its new
/// definition that fell before it was made.
async fn a_schedule_made_again_runs_no_tick_of_before_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    keiro
        .create_schedule("remade", "0 0 0 1 1 *", greet("x".into()))
        .await
        .unwrap();
    let worker = worker(&keiro).await;
    // Passes of the yearly schedule: its cursor stands at the worker's start.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let made_ms = now_ms();
    keiro.delete_schedule("remade").await.unwrap();
    keiro
        .create_schedule("remade", "*/1 * * * * *", greet("y".into()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    worker.stop().await;
    let ticks: Vec<i64> = ids(&keiro, "cron:remade:")
        .await
        .iter()
        .map(|id| {
            let tick = id.strip_prefix("cron:remade:").expect("a tick id");
            chrono::DateTime::parse_from_rfc3339(tick)
                .unwrap_or_else(|e| panic!("{id}: {e}"))
                .timestamp_millis()
        })
        .collect();
    assert!(!ticks.is_empty(), "the schedule made again ticks");
    assert!(
        ticks.iter().all(|&tick| tick >= made_ms),
        "ticks {ticks:?} include one before the schedule was made again at {made_ms}"
    );
}

/// A dynamic schedule whose definition has no future tick, or whose name
/// holds a `:` (which separates the parts of its ticks' ids), is refused.
async fn a_schedule_that_never_ticks_or_a_name_with_a_colon_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let never = keiro
        .create_schedule("never", "0 0 0 30 2 *", greet("x".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(&never, keiro::Error::InvalidSchedule { name, .. } if name == "never")
            && never.to_string().contains("no tick after now"),
        "{never}"
    );
    let colon = keiro
        .create_schedule("x:trigger", "*/4 * * * * *", greet("x".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(&colon, keiro::Error::InvalidSchedule { name, .. } if name == "x:trigger")
            && colon.to_string().contains("`:`"),
        "{colon}"
    );
    assert!(keiro
        .schedules()
        .await
        .unwrap()
        .iter()
        .all(|s| s.name != "never"));
}

/// A trigger on `db` that refuses every tick instance of schedule `name`
/// with a transient error (57P03, as a server starting up or failing over
/// would), until `DROP TRIGGER refuse_ticks ON keiro.workflows` on the
/// connection returned.
async fn refuse_ticks_of(db: &TestDb, name: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION keiro.refuse_ticks() RETURNS trigger AS $$ BEGIN \
           RAISE EXCEPTION 'the server is starting up' USING ERRCODE = '57P03'; END $$ \
         LANGUAGE plpgsql; \
         CREATE TRIGGER refuse_ticks BEFORE INSERT ON keiro.workflows FOR EACH ROW \
           WHEN (NEW.id LIKE 'cron:{name}:%') EXECUTE FUNCTION keiro.refuse_ticks();"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    admin
}

/// PostgreSQL only: a trigger makes the store refuse a tick's instance with
/// a transient error for a while, as a failover would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_whose_start_fails_for_a_while_runs_once_the_store_answers() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let mut admin = refuse_ticks_of(&db, "every_second").await;
    let worker = worker(&keiro).await;
    // Ticks fall while every start fails. The worker's scheduler makes its
    // first pass just after the worker starts, and a tick that fell before
    // that pass is not run: the first tick counted is the one after the
    // next second boundary, so a pass late by up to a second changes nothing.
    let first_refused = now_secs() + 2;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let last_refused = now_secs() - 1;
    assert!(first_refused <= last_refused, "no tick fell while refused");
    assert!(ids(&keiro, "cron:every_second:").await.is_empty());
    sqlx::raw_sql("DROP TRIGGER refuse_ticks ON keiro.workflows")
        .execute(&mut admin)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    worker.stop().await;
    let ran: Vec<i64> = ids(&keiro, "cron:every_second:")
        .await
        .iter()
        .map(|id| tick_of(id))
        .collect();
    for tick in first_refused..=last_refused {
        assert!(
            ran.contains(&tick),
            "tick {tick} was refused while the trigger stood and never ran: {ran:?}"
        );
    }
}

/// PostgreSQL only: the tick missed while no worker ran, which a worker
/// starting runs (missed ticks: run the latest), is still run when the store
/// refuses its start for a while just then (as in a failover), once it
/// answers: not dropped after the first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_tick_refused_at_start_up_runs_once_the_store_answers() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    every4_with_a_last_tick(&keiro).await;
    let mut admin = refuse_ticks_of(&db, "every4").await;
    // A tick falls with no worker running; a worker starts just after it.
    let missed = next_tick_of_every4(now_secs()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = worker(&keiro).await;
    // Its first pass met the missed tick as the latest (not the next one).
    assert!(
        now_secs() < missed + 4,
        "the worker started past the next tick; the test's window is 4 s"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let ran = |ids: Vec<String>| -> Vec<i64> {
        ids.iter()
            .map(|id| tick_after("cron:every4:", id))
            .collect()
    };
    assert!(!ran(ids(&keiro, "cron:every4:").await).contains(&missed));
    sqlx::raw_sql("DROP TRIGGER refuse_ticks ON keiro.workflows")
        .execute(&mut admin)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let ran = loop {
        let ran = ran(ids(&keiro, "cron:every4:").await);
        if ran.contains(&missed) || Instant::now() > deadline {
            break ran;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    second.stop().await;
    assert!(
        ran.contains(&missed),
        "the missed tick {missed}, refused at start-up, never ran: {ran:?}"
    );
}

/// Writes a `#[workflow(cron)]` schedule row as another version of the
/// code (or another binary) would.
async fn put_static(keiro: &Keiro, name: &str, cron: &str, timezone: &str) {
    keiro::unstable::raw_store(keiro)
        .put_schedule(&keiro_store::ScheduleDef {
            name,
            cron,
            timezone,
            workflow: name,
            input: None,
            latest_tick: None,
        })
        .await
        .expect("write a schedule row");
}

async fn stored(keiro: &Keiro, name: &str) -> Option<keiro_store::ScheduleRow> {
    keiro::unstable::raw_store(keiro)
        .schedule_named(name)
        .await
        .expect("read a schedule row")
}

/// A version of the code that dropped `#[workflow(cron)]` from `greet`
/// (linked here without it) left its schedule row: a worker of this version
/// never runs it, and deletes it as it starts. A row of a workflow no binary
/// here links any more can be deleted by hand.
async fn a_schedule_whose_attribute_was_removed_stops_and_goes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    put_static(&keiro, "greet", "*/1 * * * * *", "UTC").await;
    put_static(&keiro, "retired_report", "*/1 * * * * *", "UTC").await;
    // A management call leaves them be.
    let names: Vec<_> = keiro
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(
        names.contains(&"greet".to_owned()) && names.contains(&"retired_report".to_owned()),
        "{names:?}"
    );
    keiro.delete_schedule("retired_report").await.unwrap();
    assert_eq!(stored(&keiro, "retired_report").await, None);

    let worker = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids(&keiro, "cron:every_second:").await.len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop().await;
    assert!(
        ids(&keiro, "cron:every_second:").await.len() >= 2,
        "the worker's scheduler ran"
    );
    assert_eq!(ids(&keiro, "cron:greet:").await, Vec::<String>::new());
    assert_eq!(stored(&keiro, "greet").await, None, "the row stayed");
}

/// A `#[workflow(cron)]` schedule follows the most recently started worker
/// declaring it: a management call of a process running another version
/// (a dashboard) does not write its own definition over the workers'.
async fn a_management_call_keeps_the_definition_workers_wrote(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    put_static(&keiro, "nightly_report", "0 0 3 * * *", "Europe/Berlin").await;
    let listed = keiro.schedules().await.unwrap();
    let nightly = listed.iter().find(|s| s.name == "nightly_report").unwrap();
    assert_eq!(nightly.cron, "0 0 3 * * *");
    keiro.pause_schedule("nightly_report").await.unwrap();
    keiro.resume_schedule("nightly_report").await.unwrap();
    assert_eq!(
        stored(&keiro, "nightly_report").await.unwrap().cron,
        "0 0 3 * * *"
    );

    let worker = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while stored(&keiro, "nightly_report").await.unwrap().cron != "0 0 2 * * *"
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await;
    assert_eq!(
        stored(&keiro, "nightly_report").await.unwrap().cron,
        "0 0 2 * * *"
    );

    // A newer version dropped the attribute, and its worker deleted the
    // row: listing from this (older) binary shows its declaration, but
    // writes nothing back.
    keiro::unstable::raw_store(&keiro)
        .delete_schedule("nightly_report")
        .await
        .unwrap();
    let listed = keiro.schedules().await.unwrap();
    let nightly = listed.iter().find(|s| s.name == "nightly_report").unwrap();
    assert_eq!(
        (nightly.cron.as_str(), nightly.last_tick),
        ("0 0 2 * * *", None)
    );
    assert_eq!(stored(&keiro, "nightly_report").await, None);
}

/// A dynamic schedule cannot take the name of a `#[workflow(cron)]`
/// schedule another binary on the database declares.
async fn create_schedule_refuses_a_name_another_binary_declares(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    put_static(&keiro, "their_report", "0 0 4 * * *", "UTC").await;
    let err = keiro
        .create_schedule("their_report", "*/1 * * * * *", greet("x".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, keiro::Error::InvalidSchedule { name, .. } if name == "their_report")
            && err.to_string().contains("another binary"),
        "{err}"
    );
    let row = stored(&keiro, "their_report").await.unwrap();
    assert_eq!(
        (row.cron.as_str(), row.workflow.as_str(), row.input),
        ("0 0 4 * * *", "their_report", None)
    );
    // A dynamic schedule is still redefined in place.
    keiro
        .create_schedule("greet-bob", "0 0 5 * * *", greet("Bob".into()))
        .await
        .unwrap();
    keiro
        .create_schedule("greet-bob", "0 0 6 * * *", greet("Bob".into()))
        .await
        .unwrap();
    assert_eq!(
        stored(&keiro, "greet-bob").await.unwrap().cron,
        "0 0 6 * * *"
    );
}

/// A schedule that does not read (an expression that does not parse; on
/// SQLite also a hand-edited column of the wrong type) is skipped: the
/// other schedules go on ticking, and the bad one can be deleted.
async fn an_unreadable_schedule_leaves_the_others_running(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    keiro
        .create_schedule("greet-ok", "*/1 * * * * *", greet("ok".into()))
        .await
        .unwrap();
    store
        .put_schedule(&keiro_store::ScheduleDef {
            name: "broken-cron",
            cron: "not a cron",
            timezone: "UTC",
            workflow: "greet",
            input: Some("[\"x\"]"),
            latest_tick: None,
        })
        .await
        .unwrap();
    if let keiro_store::Store::Sqlite(sqlite) = store {
        sqlx::query(
            "INSERT INTO keiro_schedules (name, cron, timezone, workflow, input, paused, \
             created_at, updated_at) VALUES ('broken-row', '*/1 * * * * *', 'UTC', 'greet', \
             '[\"y\"]', 'yes', 0, 0)",
        )
        .execute(sqlite.pool())
        .await
        .unwrap();
    }
    let worker = worker(&keiro).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids(&keiro, "cron:greet-ok:").await.len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ids(&keiro, "cron:greet-ok:").await.len() >= 2,
        "the readable schedule ticks beside the unreadable ones"
    );
    assert!(ids(&keiro, "cron:broken-").await.is_empty());
    // The listing shows the readable ones, the broken definition with what
    // is wrong with it, and leaves the row that does not read out.
    let listed = keiro.schedules().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"greet-ok"), "{names:?}");
    assert!(!names.contains(&"broken-row"), "{names:?}");
    let ok = listed.iter().find(|s| s.name == "greet-ok").unwrap();
    assert!(ok.problem.is_none() && ok.next_tick.is_some(), "{ok:?}");
    let broken = listed.iter().find(|s| s.name == "broken-cron").unwrap();
    assert!(
        broken.next_tick.is_none()
            && broken
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("not a cron")),
        "{broken:?}"
    );
    // An unknown name is still unknown beside a row that does not read: a
    // typo deletes nothing and says so.
    for outcome in [
        keiro.delete_schedule("tpyo").await,
        keiro.pause_schedule("tpyo").await,
    ] {
        match outcome {
            Err(keiro::Error::UnknownSchedule { name, known }) => {
                assert_eq!(name, "tpyo");
                assert!(known.contains("greet-ok"), "{known}");
            }
            other => panic!("expected UnknownSchedule, got {other:?}"),
        }
    }
    keiro.delete_schedule("broken-cron").await.unwrap();
    if backend == Backend::Sqlite {
        keiro.delete_schedule("broken-row").await.unwrap();
        assert_eq!(
            stored(&keiro, "greet-ok").await.unwrap().cron,
            "*/1 * * * * *"
        );
    }
    worker.stop().await;
}

// Each case mostly waits for ticks: both backends run at once.
keiro_tests::on_both_backends_at_once!(
    a_backfill_passes_over_a_tick_another_workflow_holds,
    a_schedule_made_again_runs_no_tick_of_before_it,
    a_trigger_does_not_pass_over_a_missed_tick,
    a_new_schedules_first_tick_missed_runs_on_start_up,
    a_schedule_no_workflow_here_serves_is_reported_once,
    a_draining_worker_starts_no_tick,
    a_schedule_made_elsewhere_just_before_a_tick_runs_it,
    a_running_worker_passes_over_a_tick_that_fell_while_paused,
    a_redefined_schedule_runs_no_tick_of_before_its_change,
    a_schedule_that_never_ticks_or_a_name_with_a_colon_is_refused,
    an_unreadable_schedule_leaves_the_others_running,
    a_schedule_whose_attribute_was_removed_stops_and_goes,
    a_management_call_keeps_the_definition_workers_wrote,
    create_schedule_refuses_a_name_another_binary_declares,
    backfill_refuses_a_future_or_reversed_range,
    a_tick_that_fell_while_paused_never_runs_after_a_resume,
    a_tick_runs_at_once_without_waiting_for_a_pass,
    a_tick_waits_for_a_slot_of_a_full_worker,
    missed_ticks_run_the_latest_once_or_none,
    two_worker_processes_run_every_tick_exactly_once,
    pause_stops_ticks_and_resume_restarts_them,
    trigger_and_backfill_run_each_tick_once,
    dynamic_schedules_are_created_listed_and_deleted,
);

/// PostgreSQL: a process whose clock runs behind (here a minute) and that
/// links a `#[workflow(cron)]` schedule the table lacks writes it when it
/// first manages it (a trigger, here), stamped by the database server's
/// clock, and so is a later pause. That write time is the schedule's
/// making, from which a worker starting later counts missed ticks: stamped
/// a minute early, the worker would run a tick that fell before the
/// schedule existed (a minute late, it would lose the ticks of that
/// minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_schedule_written_by_a_process_whose_clock_is_behind_is_stamped_by_the_server() {
    use sqlx::Connection as _;
    let db = TestDb::new(Backend::Postgres).await;
    let _keiro = db.keiro().await; // migrates
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "-60s").unwrap();
    let env = keiro_tests::faketime::shifted_env(&offset);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for (call, said, paused) in [("--trigger", "triggered", 0), ("--pause", "paused", 1)] {
        let mut child =
            CrashChild::start_with_env(env!("CARGO_BIN_EXE_cron_worker"), &db, &env, &[call]);
        child.line_containing(said).await;
        assert!(child.exit_success().await, "the {call} failed");
        let (is_paused, off_by_us): (i64, i64) = sqlx::query_as(
            "SELECT paused, updated_at - (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
             FROM keiro.schedules WHERE name = 'cron_tick'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(is_paused, paused, "after the {call}");
        assert!(
            off_by_us.abs() < 10_000_000,
            "after the {call}, the schedule's write time is {} s off the server's clock",
            off_by_us / 1_000_000
        );
    }
}
