//! A worker whose clock is off the database server's (real child processes,
//! their clocks shifted by libfaketime): on PostgreSQL it refuses to start,
//! and one whose clock drifts off while it runs claims nothing, starts no
//! cron tick and fires no timer until its clock is back. On SQLite, whose
//! database is a file on this host, there is no second clock and a shifted
//! worker starts.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keiro::timers::{FireOutcome, TimerRequest, TimerStatus, TimerWorkerOptions};
use keiro::Keiro;
use keiro_store::InstanceStatus;
use keiro_tests::executors::brief;
use keiro_tests::faketime::shifted_env;
use keiro_tests::process::CrashChild;
use keiro_tests::{on_both_backends, Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_executor_process");

/// The worker's lease TTL: 10 s, so `max_clock_skew` is 2.5 s.
const LEASE_MS: &str = "10000";

on_both_backends!(
    a_worker_whose_clock_is_off_refuses_to_start_where_the_server_has_a_clock,
    a_skew_limit_of_zero_is_refused,
);

mod postgres_only {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_whose_clock_drifts_off_claims_nothing_until_it_is_back() {
        super::a_worker_whose_clock_drifts_off_claims_nothing_until_it_is_back().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scheduler_whose_clock_drifts_off_starts_no_tick_until_it_is_back() {
        super::a_scheduler_whose_clock_drifts_off_starts_no_tick_until_it_is_back().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timer_worker_whose_clock_drifts_off_fires_nothing_until_it_is_back() {
        super::a_timer_worker_whose_clock_drifts_off_fires_nothing_until_it_is_back(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_application_timer_loop_whose_clock_drifts_off_is_refused_until_it_is_back() {
        super::a_timer_worker_whose_clock_drifts_off_fires_nothing_until_it_is_back(true).await
    }
}

/// Makes `offset` say `shift` in one step (written beside it, then renamed
/// over it): libfaketime re-reads it at every reading of the clock and
/// must never find it empty or half written.
fn set_offset(offset: &Path, shift: &str) {
    let next = offset.with_extension("next");
    std::fs::write(&next, shift).unwrap();
    std::fs::rename(&next, offset).unwrap();
}

/// A worker child under libfaketime, its clock shifted by what `offset`
/// holds (`+30s`, `-1m`, `+0s`, …).
fn shifted_worker(db: &TestDb, offset: &Path) -> CrashChild {
    CrashChild::start_with_env(BIN, db, &shifted_env(offset), &["worker", LEASE_MS])
}

/// Whichever comes first of `READY …` and `error: …`.
async fn outcome(child: &mut CrashChild) -> String {
    let line = child.line_starting_any(&["READY ", "error: "]).await;
    line.trim().to_owned()
}

async fn a_worker_whose_clock_is_off_refuses_to_start_where_the_server_has_a_clock(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    for (shift, words) in [("+30s", "ahead of"), ("-30s", "behind")] {
        set_offset(&offset, shift);
        let mut child = shifted_worker(&db, &offset);
        let said = outcome(&mut child).await;
        if backend.is_postgres() {
            assert!(
                said.starts_with("error: this process's clock")
                    && said.contains(&format!(" ms {words} the database server's"))
                    && said.contains("max_clock_skew (2.5s)"),
                "a worker {shift} off the server started or said something else: {said}"
            );
            let off_ms: i64 = said
                .split(" ms ")
                .next()
                .and_then(|head| head.rsplit(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no offset in: {said}"));
            assert!(
                (29_000..=31_000).contains(&off_ms),
                "measured {off_ms} ms for a {shift} shift: {said}"
            );
            assert!(
                !child.exit_success().await,
                "a refused worker exits non-zero"
            );
        } else {
            assert!(said.starts_with("READY "), "{said}");
            child.kill().await;
        }
    }
    // The same worker on a clock that agrees starts everywhere.
    set_offset(&offset, "+0s");
    let mut child = shifted_worker(&db, &offset);
    let said = outcome(&mut child).await;
    assert!(said.starts_with("READY "), "{said}");
    child.kill().await;
}

async fn a_worker_whose_clock_drifts_off_claims_nothing_until_it_is_back() {
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    set_offset(&offset, "+0s");
    let mut child = shifted_worker(&db, &offset);
    let said = outcome(&mut child).await;
    assert!(said.starts_with("READY "), "{said}");

    let keiro = Keiro::connect(&db.url).await.unwrap();
    // Runs while the clocks agree.
    brief(10).id("before").on(&keiro).enqueue().await.unwrap();
    assert_eq!(
        wait_final(&keiro, "before").await,
        InstanceStatus::Completed
    );

    // The worker's clock jumps 40 s ahead: it would take any lease within
    // 40 s of lapsing. It notices at its next heartbeat (2.5 s).
    set_offset(&offset, "+40s");
    let stopped = child.line_containing("keiro stops claiming work").await;
    assert!(
        stopped.contains("ms ahead of the database server's"),
        "{stopped}"
    );
    // A pass that checked the clock just before it was found off ends.
    tokio::time::sleep(Duration::from_millis(200)).await;
    brief(10)
        .id("while-off")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let row = keiro
        .store()
        .get_instance("while-off")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, InstanceStatus::Pending, "{row:?}");
    assert_eq!(
        row.lease_owner, None,
        "a worker whose clock is off claimed: {row:?}"
    );

    // Back in agreement: it claims again.
    set_offset(&offset, "+0s");
    child.line_containing("is back within max_clock_skew").await;
    assert_eq!(
        wait_final(&keiro, "while-off").await,
        InstanceStatus::Completed
    );
    child.kill().await;
}

async fn a_scheduler_whose_clock_drifts_off_starts_no_tick_until_it_is_back() {
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let (offset, effects) = (dir.path().join("offset"), dir.path().join("effects"));
    set_offset(&offset, "+0s");
    // Its default lease of 10 s allows 2.5 s of skew.
    let mut child = CrashChild::start_with_env(
        env!("CARGO_BIN_EXE_cron_worker"),
        &db,
        &shifted_env(&offset),
        &[effects.to_str().unwrap()],
    );
    child.line_containing("keiro resume worker serves").await;
    let ran = || keiro_tests::process::lines_of(&effects).len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ran() < 2 {
        assert!(
            Instant::now() < deadline,
            "no tick ran while the clocks agree"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 40 s ahead, it would start the ticks of the next 40 s at once.
    set_offset(&offset, "+40s");
    child.line_containing("keiro stops claiming work").await;
    // A scheduler pass that read the clock just before ends.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = ran();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lines = keiro_tests::process::lines_of(&effects);
    assert_eq!(
        lines.len(),
        before,
        "a scheduler whose clock is off started ticks: {lines:?}"
    );

    set_offset(&offset, "+0s");
    child.line_containing("is back within max_clock_skew").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while ran() < before + 2 {
        assert!(
            Instant::now() < deadline,
            "no tick ran once the clock was back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().await;
    // No tick ran early, and none twice.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut ticks: Vec<u64> = keiro_tests::process::lines_of(&effects)
        .iter()
        .map(|line| line.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        ticks.iter().all(|&tick| tick <= now + 1),
        "{ticks:?} by {now}"
    );
    let all = ticks.len();
    ticks.sort_unstable();
    ticks.dedup();
    assert_eq!(ticks.len(), all, "a tick ran twice");
}

/// A timer worker child (`Timers::spawn_worker`, or with `drain` the
/// application's own loop calling `Timers::drain`) whose clock jumps ahead.
async fn a_timer_worker_whose_clock_drifts_off_fires_nothing_until_it_is_back(drain: bool) {
    let db = TestDb::new(Backend::Postgres).await;
    let timers = keiro_tests::timers::timers(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let (offset, effects) = (dir.path().join("offset"), dir.path().join("effects"));
    set_offset(&offset, "+0s");
    let mut env = shifted_env(&offset).to_vec();
    env.push(("TIMER_DRAIN", if drain { "1" } else { "0" }));
    let mut child = CrashChild::start_with_env(
        env!("CARGO_BIN_EXE_timer_worker"),
        &db,
        &env,
        &[effects.to_str().unwrap()],
    );
    child.line_starting_any(&["READY"]).await;
    keiro_tests::timers::schedule(&timers, keiro_tests::timers::past("before")).await;
    child.line_starting_any(&["FIRED before 1"]).await;

    // 40 s ahead: a timer due in 20 s would fire at once.
    set_offset(&offset, "+40s");
    // The loop's call is refused, saying why, as soon as the step of the
    // clock shows, before or after the next reading logs it.
    let expected: &[&str] = if drain {
        &["stops claiming timers", "REFUSED "]
    } else {
        &["stops claiming timers"]
    };
    for said in child.lines_containing_all(expected).await {
        assert!(said.contains("ms ahead of the database server's"), "{said}");
        if said.starts_with("REFUSED ") {
            assert!(said.contains("no timer was claimed"), "{said}");
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let soon = TimerRequest::new(
        "soon",
        keiro_tests::timers::PM,
        "order-soon",
        SystemTime::now() + Duration::from_secs(20),
    );
    keiro_tests::timers::schedule(&timers, soon).await;
    keiro_tests::timers::schedule(&timers, keiro_tests::timers::past("due")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in ["soon", "due"] {
        let row = keiro_tests::timers::row(&timers, id).await;
        assert_eq!(
            (row.status, row.attempts),
            (TimerStatus::Scheduled, 0),
            "a timer worker whose clock is off claimed {id}: {row:?}"
        );
    }

    // Back in agreement: the due timer fires, the other waits for its time.
    set_offset(&offset, "+0s");
    child.line_containing("claims timers again").await;
    child.line_starting_any(&["FIRED due 1"]).await;
    let soon = keiro_tests::timers::row(&timers, "soon").await;
    assert_eq!(soon.status, TimerStatus::Scheduled, "{soon:?}");
    child.kill().await;
}

async fn a_skew_limit_of_zero_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let error = db
        .builder()
        .max_clock_skew(Duration::ZERO)
        .connect()
        .await
        .unwrap_err();
    match &error {
        keiro::Error::InvalidOption { option, reason } => {
            assert_eq!(*option, "max_clock_skew");
            assert!(reason.contains("Duration::MAX"), "{reason}");
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    // A timer worker's limit likewise.
    let refused = keiro_tests::timers::timers(&db)
        .await
        .max_clock_skew(Duration::ZERO)
        .spawn_worker(TimerWorkerOptions::default(), |_| async {
            FireOutcome::completed("never")
        });
    match refused {
        Err(keiro::timers::TimerError::InvalidOption { option, reason }) => {
            assert_eq!(option, "max_clock_skew");
            assert!(reason.contains("Duration::MAX"), "{reason}");
        }
        Err(other) => panic!("expected InvalidOption, got {other:?}"),
        Ok(_) => panic!("a timer worker with a zero skew limit started"),
    }
    // And the application's own loop (`run_once`, `drain`).
    let zero = keiro_tests::timers::timers(&db)
        .await
        .max_clock_skew(Duration::ZERO);
    let options = TimerWorkerOptions::default();
    let never = |_| async { FireOutcome::completed("never") };
    let once = zero.run_once(&options, never).await.map(|_| ());
    let drained = zero.drain(&options, 10, never).await.map(|_| ());
    for refused in [once, drained] {
        match refused {
            Err(keiro::timers::TimerError::InvalidOption { option, .. }) => {
                assert_eq!(option, "max_clock_skew");
            }
            other => panic!("expected InvalidOption, got {other:?}"),
        }
    }
}

/// Polls until instance `id` is final (30 s at most); its status.
async fn wait_final(keiro: &Keiro, id: &str) -> InstanceStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = keiro.store().get_instance(id).await.unwrap().unwrap();
        if row.status.is_final() {
            return row.status;
        }
        assert!(Instant::now() < deadline, "{id} is still {:?}", row.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
