//! A pg_auto_failover formation (a monitor, two nodes, synchronous
//! replication) under a resume worker draining 200 workflows of 5 steps,
//! through a URL listing both nodes: a switchover mid-run, then a SIGKILL of
//! the primary's postmaster. Every workflow completes without restarting the
//! application, each has its 5 journal rows, no step body ran more than
//! twice (only a step whose row was in flight at the loss may run again),
//! and every result a workflow saw is the journaled one.
//!
//! Ignored by default: creating the formation and waiting out a failover
//! take a minute or two. Run it with
//! `cargo test -p keiro-tests --test failover_formation -- --ignored --nocapture`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::future::join_all;
use keiro::{step, workflow, Keiro, ResumeOptions};
use keiro_tests::pg_formation::Formation;

const WORKFLOWS: u32 = 200;
const STEPS: u32 = 5;

/// Step bodies run, by `(workflow, step)`.
fn ran() -> &'static Mutex<HashMap<(u32, u32), u32>> {
    static RAN: OnceLock<Mutex<HashMap<(u32, u32), u32>>> = OnceLock::new();
    RAN.get_or_init(Default::default)
}

/// When workflows saw a step's result.
fn seen() -> &'static Mutex<Vec<Instant>> {
    static SEEN: OnceLock<Mutex<Vec<Instant>>> = OnceLock::new();
    SEEN.get_or_init(Default::default)
}

#[step]
async fn paced(workflow: u32, n: u32) -> Result<u32, String> {
    *ran().lock().unwrap().entry((workflow, n)).or_default() += 1;
    tokio::time::sleep(Duration::from_millis(150)).await;
    Ok(workflow * 10 + n)
}

#[workflow]
async fn five_paced(workflow: u32) -> Result<u32, String> {
    let mut sum = 0;
    for n in 0..STEPS {
        let out = paced(workflow, n).await?;
        if out != workflow * 10 + n {
            return Err(format!("step {n} of {workflow} returned {out}"));
        }
        // Test instrumentation: when the result was seen, not journaled.
        #[keiro::nondeterministic_ok]
        seen().lock().unwrap().push(Instant::now());
        sum += out;
    }
    Ok(sum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "creates a pg_auto_failover formation and waits out a failover: a minute or two"]
async fn workflows_survive_a_switchover_and_a_killed_primary() {
    let formation = tokio::task::spawn_blocking(Formation::create)
        .await
        .unwrap();
    let url = formation.url();
    let keiro = Keiro::builder(&url)
        .executor_id(format!("paf-{}", uuid::Uuid::new_v4().simple()))
        .connect()
        .await
        .expect("connect to the formation's primary");
    let worker = keiro
        .resume_worker(
            ResumeOptions::default()
                .concurrency(8)
                .poll_interval(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    let mut handles = Vec::new();
    for w in 0..WORKFLOWS {
        let handle = five_paced(w)
            .id(format!("paf-{w}"))
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
        handles.push((w, handle));
    }
    let results = tokio::spawn(async move {
        join_all(handles.into_iter().map(|(w, handle)| async move {
            // Waiting reads the store: across the failover it may fail
            // with a transient error, and the caller waits again.
            let out = tokio::time::timeout(Duration::from_secs(600), async {
                loop {
                    match handle.result().await {
                        Err(error) if error.is_transient() => {
                            tokio::time::sleep(Duration::from_millis(200)).await
                        }
                        other => return other,
                    }
                }
            })
            .await;
            (w, out)
        }))
        .await
    });

    tokio::time::sleep(Duration::from_secs(3)).await;
    let formation = std::sync::Arc::new(formation);
    let switched = Instant::now();
    let f = formation.clone();
    tokio::task::spawn_blocking(move || f.switchover())
        .await
        .unwrap();
    eprintln!("switchover done in {} ms", switched.elapsed().as_millis());
    let f = formation.clone();
    tokio::task::spawn_blocking(move || f.wait_for(|| f.settled()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let f = formation.clone();
    let killed_port = tokio::task::spawn_blocking(move || f.kill_primary_postmaster())
        .await
        .unwrap();
    let killed = Instant::now();
    eprintln!("SIGKILLed the primary's postmaster on port {killed_port}");

    for (w, out) in results.await.unwrap() {
        let out = out.expect("finished within 10 minutes").unwrap();
        assert_eq!(
            out,
            Ok((0..STEPS).map(|n| w * 10 + n).sum()),
            "workflow {w}"
        );
    }
    let first_after_kill = seen()
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t > killed)
        .min()
        .map(|t| t.duration_since(killed));
    eprintln!(
        "{{\"backend\":\"postgres\",\"workload\":\"failover_first_step_after_kill\",\"value\":{},\"unit\":\"ms\"}}",
        first_after_kill.map_or(-1, |d| d.as_millis() as i64)
    );
    worker.shutdown().await;

    // Each workflow's 5 rows, with the values its run saw.
    let pool = keiro.store().postgres_pool().expect("a PostgreSQL store");
    let rows: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT workflow_id, seq, result::text FROM keiro.steps WHERE workflow_id LIKE 'paf-%'",
    )
    .persistent(false)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), (WORKFLOWS * STEPS) as usize);
    let ran = ran().lock().unwrap().clone();
    for w in 0..WORKFLOWS {
        for n in 0..STEPS {
            let times = ran.get(&(w, n)).copied().unwrap_or(0);
            assert!(
                (1..=2).contains(&times),
                "step {n} of workflow {w} ran {times} times"
            );
        }
    }
    let twice = ran.values().filter(|t| **t == 2).count();
    eprintln!("steps run twice (in flight at a loss): {twice}");
    keiro.shutdown().await.unwrap();
}
