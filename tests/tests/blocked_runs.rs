//! A run whose step body blocks the async runtime's thread cannot renew its
//! lease (the renewals run in its task): the lease lapses and another worker
//! may run its steps again. The executor heartbeat names such a run in a
//! warning, once per run, and never a run that waits without blocking.

use std::time::Duration;

use keiro::{step, workflow};
use keiro_tests::{on_both_backends, Backend, TestDb};

on_both_backends!(a_run_blocking_its_thread_past_its_lease_is_named);

/// Short, so that a block of a few seconds outlasts it; long enough that
/// a loaded machine's scheduling delays do not.
const LEASE: Duration = Duration::from_secs(1);
/// Longer than the lease plus the heartbeat's period (2.5 s).
const BLOCK: Duration = Duration::from_millis(4_500);

/// Blocks its thread, as a careless step body does.
#[step]
async fn block_the_thread(ms: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(ms));
    ms
}

#[workflow]
async fn blocks(ms: u64) -> u64 {
    block_the_thread(ms).await
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
        tokio::spawn(async move { blocks(ms).id(id).on(&keiro).await })
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
    // Once per run: the run that blocked may have stopped on its first
    // renewal after the block (its lease may have lapsed), unjournaled, and
    // a second run blocked again.
    assert!(named(&blocked_id) >= 1, "{warnings}");
    assert!(warnings.contains("spawn_blocking"), "{warnings}");
    assert_eq!(named(&awaiting_id), 0, "{warnings}");
    keiro.shutdown().await.unwrap();
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        _ => "postgres",
    }
}
