//! A run whose step body blocks the async runtime's thread cannot renew its
//! lease (the renewals run in its task): the lease lapses and another worker
//! may run its steps again. The executor heartbeat names such a run in a
//! warning, once per run, and never a run that waits without blocking. When
//! nobody took the lease meanwhile, the run goes on once the block ends: it
//! is not stopped and replayed, and the step it blocked in runs once. An
//! instance of a named queue is the exception: its lapsed slot may have gone
//! to another instance, so its run stops and queues again.

use std::sync::Mutex;
use std::time::Duration;

use keiro::{step, workflow};
use keiro_tests::{on_both_backends, Backend, TestDb};

on_both_backends!(
    a_run_blocking_its_thread_past_its_lease_is_named,
    a_run_whose_lapsed_lease_was_taken_stops_after_its_block,
    a_pipelined_run_whose_lapsed_lease_was_taken_starts_no_further_step,
    a_run_whose_instance_was_run_further_and_claimed_back_stops,
    a_run_held_up_replays_the_steps_another_ran_meanwhile,
    a_retry_after_a_block_starts_only_on_a_checked_lease,
    a_retry_held_up_replays_the_result_another_ran_meanwhile,
    a_queued_run_held_up_past_its_lease_gives_up_its_refilled_slot
);

/// Short, so that a block of a few seconds outlasts it; long enough that
/// a loaded machine's scheduling delays do not.
const LEASE: Duration = Duration::from_secs(1);
/// Longer than the lease plus the heartbeat's period (2.5 s).
const BLOCK: Duration = Duration::from_millis(4_500);

/// Each start of a blocking step body and of a blocking workflow's body
/// (a replay included), by the tag its test gave: the backends' tests run
/// at once in this binary.
static STEP_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static BODY_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn count(runs: &Mutex<Vec<String>>, tag: &str) -> usize {
    runs.lock().unwrap().iter().filter(|t| *t == tag).count()
}

/// Blocks its thread, as a careless step body does.
#[step]
async fn block_the_thread(ms: u64, tag: String) -> u64 {
    STEP_RUNS.lock().unwrap().push(tag);
    std::thread::sleep(Duration::from_millis(ms));
    ms
}

#[workflow]
async fn blocks(ms: u64, tag: String) -> u64 {
    BODY_RUNS.lock().unwrap().push(tag.clone());
    block_the_thread(ms, tag).await
}

/// Waits as long without blocking.
#[step]
async fn await_a_while(ms: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    ms
}

#[workflow]
async fn awaits(ms: u64) -> u64 {
    await_a_while(ms).await
}

async fn a_run_blocking_its_thread_past_its_lease_is_named(backend: Backend) {
    keiro_tests::warnings::capture();
    let db = TestDb::new(backend).await;
    let keiro = db.builder().lease_ttl(LEASE).connect().await.unwrap();
    let ms = BLOCK.as_millis() as u64;
    let blocked_id = format!("blocked-{}", backend_name(backend));
    let awaiting_id = format!("awaiting-{}", backend_name(backend));
    // The blocking run on a thread of its own, so the test's tasks and the
    // heartbeat keep theirs.
    let blocked = {
        let (keiro, id) = (keiro.clone(), blocked_id.clone());
        tokio::spawn(async move { blocks(ms, id.clone()).id(id).on(&keiro).await })
    };
    let awaited = awaits(ms).id(awaiting_id.as_str()).on(&keiro).await;
    assert_eq!(awaited.unwrap(), ms);
    assert_eq!(blocked.await.unwrap().unwrap(), ms);
    // One more heartbeat: a run that ended is never named.
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let warnings = keiro_tests::warnings::logged();
    let named = |id: &str| {
        warnings
            .lines()
            .filter(|line| line.contains("has not renewed its lease") && line.contains(id))
            .count()
    };
    assert_eq!(named(&blocked_id), 1, "{warnings}");
    // Nobody took the lapsed lease (no other executor runs here): the run
    // asked the store, went on, and was neither stopped nor replayed.
    assert_eq!(count(&STEP_RUNS, &blocked_id), 1, "{warnings}");
    assert_eq!(count(&BODY_RUNS, &blocked_id), 1, "{warnings}");
    assert!(warnings.contains("spawn_blocking"), "{warnings}");
    assert_eq!(named(&awaiting_id), 0, "{warnings}");
    keiro.shutdown().await.unwrap();
}

/// Each start of the step after the block, by tag.
static AFTER_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Blocks its thread the first time it runs for `tag` only, so the
/// executor that takes the instance over runs it at once.
#[step]
async fn block_the_first_time(ms: u64, tag: String) -> u64 {
    let first = {
        let mut runs = STEP_RUNS.lock().unwrap();
        runs.push(tag.clone());
        runs.iter().filter(|t| **t == tag).count() == 1
    };
    if first {
        std::thread::sleep(Duration::from_millis(ms));
    }
    ms
}

#[step]
async fn after_the_block(tag: String) -> u32 {
    AFTER_RUNS.lock().unwrap().push(tag);
    7
}

#[workflow]
async fn blocks_then_goes_on(ms: u64, tag: String) -> u32 {
    block_the_first_time(ms, tag.clone()).await;
    after_the_block(tag).await
}

async fn a_run_whose_lapsed_lease_was_taken_stops_after_its_block(backend: Backend) {
    let (_db, a, b, id) = two_executors(backend, "taken").await;
    let ms = BLOCK.as_millis() as u64;
    let blocked = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move { blocks_then_goes_on(ms, id.clone()).id(id).on(&a).await })
    };
    // Past the lease while the run blocks: another executor takes the
    // instance over and runs it to its end.
    resume_until(&b, ms, |pass| pass.completed == 1).await;
    // The blocked run, asking the store once the block ends, finds the
    // lease gone and does not go on to the next step.
    let output = blocked.await.unwrap();
    assert_eq!(output.unwrap(), 7);
    assert_eq!(count(&STEP_RUNS, &id), 2, "the block, then b's run");
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b's run only");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[workflow(journal = "pipelined")]
async fn pipelined_blocks_then_goes_on(ms: u64, tag: String) -> u32 {
    block_the_first_time(ms, tag.clone()).await;
    after_the_block(tag).await
}

/// A pipelined step's row is journaled later, so the body goes on to its
/// next step in the same poll: that step waits for the lease to be checked.
async fn a_pipelined_run_whose_lapsed_lease_was_taken_starts_no_further_step(backend: Backend) {
    let (_db, a, b, id) = two_executors(backend, "pipelined").await;
    let ms = BLOCK.as_millis() as u64;
    let blocked = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move {
            pipelined_blocks_then_goes_on(ms, id.clone())
                .id(id)
                .on(&a)
                .await
        })
    };
    resume_until(&b, ms, |pass| pass.completed == 1).await;
    assert_eq!(blocked.await.unwrap().unwrap(), 7);
    assert_eq!(count(&STEP_RUNS, &id), 2, "the block, then b's run");
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b's run only");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Each start of the step after the durable sleep, by tag.
static LAST_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[step]
async fn after_the_sleep(tag: String) -> u32 {
    LAST_RUNS.lock().unwrap().push(tag);
    9
}

#[workflow]
async fn blocks_then_sleeps(ms: u64, tag: String) -> u32 {
    block_the_first_time(ms, tag.clone()).await;
    after_the_block(tag.clone()).await;
    // Longer than `suspend_after` (1 s): the run suspends, letting go.
    keiro::sleep(Duration::from_millis(1_500)).await;
    after_the_sleep(tag).await
}

/// Another executor runs the instance further while the run blocks, then
/// suspends it; this process's own resume worker claims it back, under the
/// same lease owner. The renewal holds, but the journal went past the run:
/// it stops, and the instance resumes from the journal, each step once.
async fn a_run_whose_instance_was_run_further_and_claimed_back_stops(backend: Backend) {
    let (_db, a, b, id) = two_executors(backend, "further").await;
    let ms = BLOCK.as_millis() as u64;
    let blocked = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move { blocks_then_sleeps(ms, id.clone()).id(id).on(&a).await })
    };
    resume_until(&b, ms, |pass| pass.resumed == 1).await;
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b ran the step after the block");
    let status = b.store().get_instance(&id).await.unwrap().unwrap().status;
    assert!(
        !status.is_final(),
        "b suspended it in its sleep: {status:?}"
    );
    // Claims it back once its sleep is over, while the run still blocks.
    let worker = a
        .resume_worker(keiro::ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    assert_eq!(blocked.await.unwrap().unwrap(), 9);
    assert_eq!(count(&STEP_RUNS, &id), 2, "the block, then b's run");
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b's run only");
    assert_eq!(count(&LAST_RUNS, &id), 1);
    worker.shutdown().await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Each start of the step that waits for the other executor's shutdown.
static WAIT_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Waits 3 s (asynchronously) the first time it runs for `tag`.
#[step]
async fn waits_the_first_time(tag: String) -> u32 {
    let first = {
        let mut runs = WAIT_RUNS.lock().unwrap();
        runs.push(tag.clone());
        runs.iter().filter(|t| **t == tag).count() == 1
    };
    if first {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    5
}

#[workflow]
async fn joins_then_waits(ms: u64, tag: String) -> u32 {
    // Both steps take their ids at the call: the second is allocated, not
    // started, while the first blocks.
    let (_, after) = tokio::join!(
        block_the_first_time(ms, tag.clone()),
        after_the_block(tag.clone())
    );
    after + waits_the_first_time(tag).await
}

/// Another executor runs both steps of a `join!` while the run blocks in
/// the first, then is shut down mid-way through the next step (its lease
/// released, no row past the join); this process's resume worker claims
/// the instance back. Nothing was journaled beyond the run's frontier, so
/// it goes on, and the join's second step, which it had not started,
/// replays the other run's row instead of running again.
async fn a_run_held_up_replays_the_steps_another_ran_meanwhile(backend: Backend) {
    let (_db, a, b, id) = two_executors(backend, "joined").await;
    let ms = BLOCK.as_millis() as u64;
    let blocked = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move { joins_then_waits(ms, id.clone()).id(id).on(&a).await })
    };
    takes_over_then_stops(&b, &id, ms).await;
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b ran the join's second step");
    let worker = a
        .resume_worker(keiro::ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    assert_eq!(blocked.await.unwrap().unwrap(), 12);
    assert_eq!(count(&STEP_RUNS, &id), 2, "the block, then b's run");
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b's run only");
    assert_eq!(count(&WAIT_RUNS, &id), 2, "b's, stopped, then the run's");
    worker.shutdown().await;
    a.shutdown().await.unwrap();
}

/// Each attempt of the retried step, by tag.
static RETRY_RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Blocks its thread and fails the first time it runs for `tag`; retried
/// at once, without a backoff that would yield to the run's drive loop.
#[step(max_attempts = 3, backoff_ms = 0)]
async fn block_and_fail_the_first_time(ms: u64, tag: String) -> Result<u32, String> {
    let first = {
        let mut runs = RETRY_RUNS.lock().unwrap();
        runs.push(tag.clone());
        runs.iter().filter(|t| **t == tag).count() == 1
    };
    if first {
        std::thread::sleep(Duration::from_millis(ms));
        return Err("blocked, then failed".into());
    }
    Ok(3)
}

#[workflow]
async fn retries_after_a_block(ms: u64, tag: String) -> Result<u32, String> {
    block_and_fail_the_first_time(ms, tag).await
}

/// The attempt that blocked fails, and the next would start at once: it
/// waits for the lease to be checked instead, which finds that another
/// executor ran the instance to its end meanwhile. The step's attempts are
/// the blocked one and the other executor's, never a third.
async fn a_retry_after_a_block_starts_only_on_a_checked_lease(backend: Backend) {
    let (_db, a, b, id) = two_executors(backend, "retried").await;
    let ms = BLOCK.as_millis() as u64;
    let blocked = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move { retries_after_a_block(ms, id.clone()).id(id).on(&a).await })
    };
    resume_until(&b, ms, |pass| pass.completed == 1).await;
    assert_eq!(blocked.await.unwrap().unwrap(), Ok(3));
    assert_eq!(count(&RETRY_RUNS, &id), 2, "the block, then b's run");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// The runtime's only thread is held up (here by the test's own task)
/// while the run awaits its first step, and its deadline passes meanwhile:
/// the run times out before its body is polled again, so none of the
/// workflow's code runs past its deadline. (A pipelined run would go on
/// past the step in that one poll; the next step would wait for the
/// lease's check.)
mod held_up_past_its_deadline {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn sqlite() {
        starts_no_further_step(Backend::Sqlite).await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn postgres() {
        starts_no_further_step(Backend::Postgres).await
    }

    /// Each start of the step the run awaits, by tag.
    static AWAITING: Mutex<Vec<String>> = Mutex::new(Vec::new());

    #[step]
    async fn note_then_await(tag: String) -> u32 {
        AWAITING.lock().unwrap().push(tag);
        tokio::time::sleep(Duration::from_millis(300)).await;
        1
    }

    /// Each time the body went on past its first step, by tag.
    static WENT_ON: Mutex<Vec<String>> = Mutex::new(Vec::new());

    #[workflow(journal = "pipelined")]
    async fn awaits_then_steps(tag: String) -> u32 {
        note_then_await(tag.clone()).await;
        WENT_ON.lock().unwrap().push(tag.clone());
        after_the_block(tag).await
    }

    async fn starts_no_further_step(backend: Backend) {
        let db = TestDb::new(backend).await;
        let keiro = db.builder().lease_ttl(LEASE).connect().await.unwrap();
        let id = format!("deadline-{}", backend_name(backend));
        let run = {
            let (keiro, id) = (keiro.clone(), id.clone());
            tokio::spawn(async move {
                awaits_then_steps(id.clone())
                    .id(id)
                    .timeout(Duration::from_secs(2))
                    .on(&keiro)
                    .await
            })
        };
        // The run starts its first step, then this task holds the only
        // thread past the deadline.
        let started = std::time::Instant::now() + Duration::from_secs(5);
        while count(&AWAITING, &id) == 0 {
            assert!(std::time::Instant::now() < started, "the run never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        std::thread::sleep(BLOCK);
        let output = run.await.unwrap();
        assert!(
            matches!(output, Err(keiro::Error::TimedOut { .. })),
            "{output:?}"
        );
        assert_eq!(
            count(&WENT_ON, &id),
            0,
            "the body went on past its deadline"
        );
        assert_eq!(count(&AFTER_RUNS, &id), 0, "no step after the deadline");
        keiro.shutdown().await.unwrap();
    }
}

#[workflow(journal = "pipelined")]
async fn joins_a_retry_then_waits(ms: u64, tag: String) -> u32 {
    BODY_RUNS.lock().unwrap().push(tag.clone());
    let (first, after) = tokio::join!(
        block_and_fail_the_first_time(ms, tag.clone()),
        after_the_block(tag.clone())
    );
    // 100 for the blocked attempt's `Err`, which the journal contradicts.
    first.unwrap_or(100) + after + waits_the_first_time(tag).await
}

/// As `a_run_held_up_replays_the_steps_another_ran_meanwhile`, with a
/// retried step in the join whose first attempt blocks, then fails:
/// another executor ran the step to `Ok` meanwhile, and the held-up run,
/// pipelined (its own result would be used at once), goes on with that
/// `Ok` instead of its own `Err` or a second attempt.
async fn a_retry_held_up_replays_the_result_another_ran_meanwhile(backend: Backend) {
    let (_db, a, b, id) = two_executors(backend, "retry-joined").await;
    let ms = BLOCK.as_millis() as u64;
    let blocked = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move { joins_a_retry_then_waits(ms, id.clone()).id(id).on(&a).await })
    };
    takes_over_then_stops(&b, &id, ms).await;
    let worker = a
        .resume_worker(keiro::ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    assert_eq!(blocked.await.unwrap().unwrap(), 3 + 7 + 5);
    // b's run and the held-up one, which went on (not stopped and resumed).
    assert_eq!(count(&BODY_RUNS, &id), 2);
    assert_eq!(count(&RETRY_RUNS, &id), 2, "the block, then b's run");
    assert_eq!(count(&AFTER_RUNS, &id), 1, "b's run only");
    assert_eq!(count(&WAIT_RUNS, &id), 2, "b's, stopped, then the run's");
    worker.shutdown().await;
    a.shutdown().await.unwrap();
}

/// While the run blocks: `b` takes the instance over once its lease has
/// lapsed and runs it to the step that waits (`waits_the_first_time`),
/// then is shut down there, its lease released with nothing journaled
/// past the join.
async fn takes_over_then_stops(b: &keiro::Keiro, id: &str, block_ms: u64) {
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    let deadline = std::time::Instant::now() + Duration::from_millis(block_ms - 2_000);
    // Passes until one claims the instance (a pass that claims nothing
    // ends at once) and runs it to the waiting step.
    let mut b_pass = None;
    while count(&WAIT_RUNS, id) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "b never reached the step after the join"
        );
        if b_pass
            .as_ref()
            .is_none_or(|pass: &tokio::task::JoinHandle<_>| pass.is_finished())
        {
            let b = b.clone();
            b_pass = Some(tokio::spawn(async move {
                b.resume_once(&keiro::ResumeOptions::default().log(|_| {}))
                    .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.shutdown().await.unwrap();
    let _ = b_pass.expect("a pass ran").await.unwrap();
}

/// PostgreSQL only: a renewal is in flight when the body blocks its
/// thread, and stays unanswered (the instance's row is locked by another
/// session) until well past the block. The run does not take the unanswered
/// renewal for a lost lease: it waits for the store to confirm the lease,
/// which it does once the row is free, and goes on without being stopped
/// and run again.
mod renewal_in_flight {
    use super::*;
    use sqlx::Connection;

    /// Each run that got past the first step, and each whose block ended,
    /// by tag.
    static PAST_FIRST: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static BLOCK_ENDED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    #[step]
    async fn first_step() -> u32 {
        1
    }

    #[workflow]
    async fn waits_then_blocks(ms: u64, tag: String) -> u32 {
        BODY_RUNS.lock().unwrap().push(tag.clone());
        first_step().await;
        PAST_FIRST.lock().unwrap().push(tag.clone());
        // A plain wait (not durable), long enough for a renewal to be sent,
        // then a block of the thread in the body itself.
        #[keiro::nondeterministic_ok]
        tokio::time::sleep(Duration::from_millis(600)).await;
        #[keiro::nondeterministic_ok]
        std::thread::sleep(Duration::from_millis(ms));
        BLOCK_ENDED.lock().unwrap().push(tag.clone());
        after_the_block(tag).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_unanswered_through_a_block_does_not_stop_the_run() {
        let db = TestDb::new(Backend::Postgres).await;
        let keiro = db.builder().lease_ttl(LEASE).connect().await.unwrap();
        let id = "in-flight-postgres".to_owned();
        let ms = BLOCK.as_millis() as u64;
        let run = {
            let (keiro, id) = (keiro.clone(), id.clone());
            tokio::spawn(async move { waits_then_blocks(ms, id.clone()).id(id).on(&keiro).await })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let wait_for = |runs: &'static Mutex<Vec<String>>, what: &'static str| {
            let id = id.clone();
            async move {
                while count(runs, &id) == 0 {
                    assert!(std::time::Instant::now() < deadline, "{what}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        // Once the first step is journaled (its row needs the instance's),
        // another session locks the instance's row: the renewal sent during
        // the wait, a third of the lease in, hangs on it.
        wait_for(&PAST_FIRST, "the run never got past its first step").await;
        let mut admin = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
        sqlx::raw_sql("BEGIN").execute(&mut admin).await.unwrap();
        sqlx::query("SELECT 1 FROM keiro.workflows WHERE id = $1 FOR UPDATE")
            .bind(&id)
            .execute(&mut admin)
            .await
            .unwrap();
        // The block ends long after the renewal's time ran out; the row is
        // freed a little later, within the lease's TTL of the block's end.
        wait_for(&BLOCK_ENDED, "the block never ended").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::raw_sql("ROLLBACK").execute(&mut admin).await.unwrap();
        // A run stopped instead would be resumed (its body run again) here.
        let worker = keiro
            .resume_worker(keiro::ResumeOptions::default().poll_interval(Duration::from_millis(50)))
            .await
            .unwrap();
        assert_eq!(run.await.unwrap().unwrap(), 7);
        assert_eq!(
            count(&BODY_RUNS, &id),
            1,
            "the run was stopped and run again"
        );
        assert_eq!(count(&AFTER_RUNS, &id), 1);
        worker.shutdown().await;
        keiro.shutdown().await.unwrap();
    }
}

keiro::queue!(
    /// One at a time, for [`a_queued_run_held_up_past_its_lease_gives_up_its_refilled_slot`].
    ONE_AT_A_TIME = "blocked-runs-one-at-a-time",
    concurrency = 1
);

/// Per tag: whether [`holds_the_slot`] of that tag is running now.
static HOLDING: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Per tag: what [`after_the_block_on_a_queue`] saw of [`HOLDING`] when it
/// started.
static SAW_HOLDER: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());

/// Runs for `ms` (awaiting), marked in [`HOLDING`] meanwhile.
#[step]
async fn holds_the_slot(ms: u64, tag: String) -> u32 {
    HOLDING.lock().unwrap().push(tag.clone());
    tokio::time::sleep(Duration::from_millis(ms)).await;
    HOLDING.lock().unwrap().retain(|t| *t != tag);
    1
}

#[workflow]
async fn holder(ms: u64, tag: String) -> u32 {
    holds_the_slot(ms, tag).await
}

#[step]
async fn after_the_block_on_a_queue(tag: String) -> u32 {
    let holding = HOLDING.lock().unwrap().contains(&tag);
    SAW_HOLDER.lock().unwrap().push((tag, holding));
    7
}

#[workflow]
async fn blocks_on_a_queue(ms: u64, tag: String) -> u32 {
    block_the_first_time(ms, tag.clone()).await;
    after_the_block_on_a_queue(tag).await
}

/// A queue of concurrency 1: a run held up past its lease (its step body
/// blocks the thread) loses its slot to a claim of another worker, which
/// starts an instance ahead of it in run order. Once the block ends, the
/// held-up run must not take its slot back and go on beside that one (two
/// running on a queue of one): its lease renewal is refused, it stops, and
/// the instance runs again once the slot is free.
async fn a_queued_run_held_up_past_its_lease_gives_up_its_refilled_slot(backend: Backend) {
    let db = TestDb::new(backend).await;
    let b = db.builder().lease_ttl(LEASE).connect().await.unwrap();
    let id = format!("queued-held-up-{}", backend_name(backend));
    let ms = BLOCK.as_millis() as u64;
    let holder_tag = format!("{id}-holder");
    let blocked = blocks_on_a_queue(ms, holder_tag.clone())
        .id(id.as_str())
        .queue(&ONE_AT_A_TIME)
        .on(&b)
        .enqueue()
        .await
        .unwrap();
    // Ahead of it in run order, but due only once its lease lapsed; another
    // worker's claim then finds the slot free and starts this one, which
    // holds the slot until well after the block ended.
    let ahead_after = LEASE * 2;
    let held_slot = holder(ms + 3_000, holder_tag.clone())
        .id(format!("{id}-ahead"))
        .queue(&ONE_AT_A_TIME)
        .priority(-1)
        .delay(ahead_after)
        .on(&b)
        .enqueue()
        .await
        .unwrap();
    let enqueued = std::time::Instant::now();
    let quiet = || keiro::ResumeOptions::default().log(|_| {});
    // The worker whose run blocks, on a runtime of its own (as in a process
    // of its own): the block holds up its thread, not this test's.
    let a_worker = {
        let a = db.builder().lease_ttl(LEASE);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let a = a.connect().await.unwrap();
                a.resume_once(&quiet()).await.unwrap();
                a.shutdown().await.unwrap();
            })
        })
    };
    let deadline = enqueued + Duration::from_secs(10);
    while count(&STEP_RUNS, &holder_tag) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        enqueued.elapsed() < ahead_after,
        "the run started after the instance ahead was due"
    );
    tokio::time::sleep_until((enqueued + ahead_after + Duration::from_millis(200)).into()).await;
    // Passes until one starts the instance ahead (and runs it to its end):
    // a pass made before the held-up run's lease lapsed finds no room.
    let b_pass = {
        let b = b.clone();
        tokio::spawn(async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while b.resume_once(&quiet()).await?.completed == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the other worker never ran the instance ahead"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok::<_, keiro::Error>(())
        })
    };
    while !HOLDING.lock().unwrap().contains(&holder_tag) {
        assert!(
            std::time::Instant::now() < deadline,
            "the other worker never started the instance ahead"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        enqueued.elapsed() < Duration::from_millis(ms),
        "the instance ahead started after the block ended"
    );
    tokio::task::spawn_blocking(move || a_worker.join().unwrap())
        .await
        .unwrap();
    b_pass.await.unwrap().unwrap();
    assert_eq!(held_slot.result().await.unwrap(), 1);
    // The held-up instance runs again once the slot is free.
    let ran_after = || {
        SAW_HOLDER
            .lock()
            .unwrap()
            .iter()
            .any(|(tag, _)| *tag == holder_tag)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !ran_after() {
        assert!(
            std::time::Instant::now() < deadline,
            "the held-up instance never ran again"
        );
        b.resume_once(&quiet()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(blocked.result().await.unwrap(), 7);
    let saw: Vec<bool> = SAW_HOLDER
        .lock()
        .unwrap()
        .iter()
        .filter(|(tag, _)| *tag == holder_tag)
        .map(|(_, holding)| *holding)
        .collect();
    assert_eq!(
        saw,
        [false],
        "the held-up run went on beside the one that took its slot"
    );
    b.shutdown().await.unwrap();
}

/// Two executors (`a`, `b`) with a lease of [`LEASE`] on a fresh database,
/// and an instance id starting with `kind`, one per backend.
async fn two_executors(
    backend: Backend,
    kind: &str,
) -> (TestDb, keiro::Keiro, keiro::Keiro, String) {
    let db = TestDb::new(backend).await;
    let a = db.builder().lease_ttl(LEASE).connect().await.unwrap();
    let b = db.builder().lease_ttl(LEASE).connect().await.unwrap();
    let id = format!("{kind}-{}", backend_name(backend));
    (db, a, b, id)
}

/// Resume passes of `b` every 200 ms until one satisfies `done`; the blocked
/// run's lease lapses after a second, so one does well before the block of
/// `block_ms` ends.
async fn resume_until(
    b: &keiro::Keiro,
    block_ms: u64,
    done: impl Fn(&keiro::ResumeSummary) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_millis(block_ms - 1_000);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let pass = b
            .resume_once(&keiro::ResumeOptions::default().log(|_| {}))
            .await
            .unwrap();
        if done(&pass) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b never took the instance over"
        );
    }
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        _ => "postgres",
    }
}
