//! The pipelined journal (`#[workflow(journal = "pipelined")]`,
//! `KeiroBuilder::journal`) in one process, on both backends: steps run
//! ahead of their rows' commits, every row is journaled in order, an event
//! set after some steps becomes visible only once their rows are durable,
//! and the rows left when the run returns commit with its end; a run that
//! meets a row another executor journaled first journals nothing after it.
//! The crash half (a SIGKILL mid-run) is `pipelined_crash.rs`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use keiro::{step, workflow, Journal, Keiro, ResumeOptions};
use keiro_store::{StepRow, Store};
use keiro_tests::{on_both_backends, Backend, TestDb};

/// How many steps each observing workflow runs.
const STEPS: u32 = 20;

/// A store per database URL, for step bodies that look at their own journal.
fn stores() -> &'static Mutex<HashMap<String, Store>> {
    static STORES: OnceLock<Mutex<HashMap<String, Store>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// How many rows of workflow `id`'s journal are durable as step `n` starts.
#[step]
async fn durable_before(url: String, id: String, n: u32) -> (u32, usize) {
    let store = stores()
        .lock()
        .unwrap()
        .get(&url)
        .cloned()
        .expect("the test registers its store before running workflows");
    let rows = store.load_journal(&id, 0).await.expect("read the journal");
    (n, rows.len())
}

/// Each step records how much of its journal was durable as it began.
async fn observe(url: String, id: String) -> Vec<(u32, usize)> {
    let mut seen = Vec::new();
    for n in 0..STEPS {
        seen.push(durable_before(url.clone(), id.clone(), n).await);
    }
    seen
}

/// [`observe`] with a pipelined journal, whatever the runtime's default.
#[workflow(journal = "pipelined")]
async fn observed_pipelined(url: String, id: String) -> Vec<(u32, usize)> {
    observe(url, id).await
}

/// [`observe`] journaling strictly, whatever the runtime's default.
#[workflow(journal = "strict")]
async fn observed_strict(url: String, id: String) -> Vec<(u32, usize)> {
    observe(url, id).await
}

/// [`observe`] as the runtime's default says.
#[workflow]
async fn observed_default(url: String, id: String) -> Vec<(u32, usize)> {
    observe(url, id).await
}

/// Whether some step began before every earlier row was durable.
fn ran_ahead(seen: &[(u32, usize)]) -> bool {
    seen.iter().any(|&(n, durable)| durable < n as usize)
}

async fn connect(db: &TestDb, journal: Journal) -> Keiro {
    let keiro = db.builder().journal(journal).connect().await.unwrap();
    let store = keiro::unstable::raw_store(&keiro).clone();
    stores().lock().unwrap().insert(db.url.clone(), store);
    keiro
}

async fn steps_run_ahead_only_when_pipelined(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = connect(&db, Journal::Strict).await;
    let url = db.url.clone();

    let strict = observed_strict(url.clone(), "strict".into())
        .on(&keiro)
        .id("strict")
        .await
        .unwrap();
    // Strict: every step starts with all earlier rows durable.
    for &(n, durable) in &strict {
        assert_eq!(durable, n as usize, "strict step {n} began early");
    }
    let default = observed_default(url.clone(), "default".into())
        .on(&keiro)
        .id("default")
        .await
        .unwrap();
    assert!(!ran_ahead(&default), "the default journal is strict");

    let pipelined = observed_pipelined(url.clone(), "pipelined".into())
        .on(&keiro)
        .id("pipelined")
        .await
        .unwrap();
    assert!(
        ran_ahead(&pipelined),
        "no pipelined step began before its predecessors were durable: {pipelined:?}"
    );
    // Whatever ran ahead, the run's end waited for its rows: all are there,
    // in order, with the values the steps returned.
    let rows = keiro::unstable::raw_store(&keiro)
        .load_journal("pipelined", 0)
        .await
        .unwrap();
    assert_eq!(rows.len(), STEPS as usize);
    for (seq, row) in rows.iter().enumerate() {
        assert_eq!(row.seq, seq as i64);
        let recorded: (u32, usize) = serde_json::from_str(&row.result).unwrap();
        assert_eq!(recorded, pipelined[seq]);
    }
    keiro.shutdown().await.unwrap();

    // A runtime whose default is pipelined: workflows that do not say
    // pipeline, and `journal = "strict"` still journals strictly.
    let keiro = connect(&db, Journal::Pipelined).await;
    let default = observed_default(url.clone(), "default-2".into())
        .on(&keiro)
        .id("default-2")
        .await
        .unwrap();
    assert!(
        ran_ahead(&default),
        "the builder's default applies: {default:?}"
    );
    let strict = observed_strict(url.clone(), "strict-2".into())
        .on(&keiro)
        .id("strict-2")
        .await
        .unwrap();
    assert!(
        !ran_ahead(&strict),
        "`journal = \"strict\"` wins over the default"
    );
    keiro.shutdown().await.unwrap();
}

/// `n` quick steps, then event `done` set to `n` (a barrier), then waits for
/// a message so the run is still going when the test reads.
#[workflow(journal = "pipelined")]
async fn then_announce(n: u32) -> Result<u32, String> {
    let mut total = 0;
    for i in 1..=n {
        total += quick(i).await;
    }
    keiro::set_event("done", &n)
        .await
        .map_err(|e| e.to_string())?;
    keiro::recv::<()>("finish")
        .await
        .map_err(|e| e.to_string())?;
    Ok(total)
}

#[step]
async fn quick(i: u32) -> u32 {
    i
}

/// Each journal row of `id`'s generation 0: its seq and when it was written
/// (the store clock when its transaction wrote it).
async fn written_at(keiro: &Keiro, id: &str) -> Vec<(i64, i64)> {
    let sql = |steps: &str| {
        format!("SELECT seq, created_at FROM {steps} WHERE workflow_id = $1 ORDER BY seq")
    };
    match keiro::unstable::raw_store(keiro) {
        Store::Sqlite(s) => sqlx::query_as(&sql("keiro_steps"))
            .bind(id)
            .fetch_all(s.pool())
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_as(&sql("keiro.steps"))
            .bind(id)
            .fetch_all(s.pool())
            .await
            .unwrap(),
    }
}

async fn an_event_is_visible_only_after_the_rows_before_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = connect(&db, Journal::Strict).await;
    let reader = db.keiro().await;
    for attempt in 0..5u32 {
        let id = format!("announce-{attempt}");
        let steps = 30;
        let handle = then_announce(steps)
            .on(&keiro)
            .id(&id)
            .start()
            .await
            .unwrap();
        let seen: Option<u32> = reader
            .get_event(&id, "done")
            .wait(Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(seen, Some(steps));
        // The moment the event shows, every step before it is durable.
        let rows = keiro::unstable::raw_store(&reader)
            .load_journal(&id, 0)
            .await
            .unwrap();
        let seqs: Vec<i64> = rows.iter().map(|row| row.seq).collect();
        assert!(
            seqs.len() > steps as usize,
            "attempt {attempt}: the event showed with only {} rows journaled",
            seqs.len()
        );
        assert_eq!(seqs, (0..seqs.len() as i64).collect::<Vec<_>>());
        // And none was written after it: the event waited for the rows
        // (the steps run faster than a commit, so without that barrier the
        // later rows commit in a round that starts after the event).
        let written = written_at(&reader, &id).await;
        let event_at = written[steps as usize].1;
        for &(seq, at) in &written[..steps as usize] {
            assert!(
                at <= event_at,
                "attempt {attempt}: step #{seq} was written {} µs after the event",
                at - event_at
            );
        }
        reader.send(&id, "finish", &()).await.unwrap();
        let total = handle.result().await.unwrap().unwrap();
        assert_eq!(total, steps * (steps + 1) / 2);
    }
    keiro.shutdown().await.unwrap();
}

/// `n` quick steps; returns their sum.
#[workflow(journal = "pipelined")]
async fn quick_sum(n: u32) -> u32 {
    let mut total = 0;
    for i in 1..=n {
        total += quick(i).await;
    }
    total
}

/// When instance `id` was last written (its end, once it ended), by the
/// store clock.
async fn updated_at(keiro: &Keiro, id: &str) -> i64 {
    let sql = |workflows: &str| format!("SELECT updated_at FROM {workflows} WHERE id = $1");
    match keiro::unstable::raw_store(keiro) {
        Store::Sqlite(s) => sqlx::query_scalar(&sql("keiro_workflows"))
            .bind(id)
            .fetch_one(s.pool())
            .await
            .unwrap(),
        Store::Postgres(s) => sqlx::query_scalar(&sql("keiro.workflows"))
            .bind(id)
            .fetch_one(s.pool())
            .await
            .unwrap(),
    }
}

/// The rows a pipelined run still had queued when it returned commit with
/// its end, in one transaction (they carry its time), and none after it.
/// Whether any are left depends on where the flush in flight was, so five
/// runs must show it at least once; before, every row committed ahead of
/// the end, in a transaction of its own.
async fn the_last_rows_of_a_pipelined_run_commit_with_its_end(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = connect(&db, Journal::Strict).await;
    let steps = 30u32;
    let mut together = 0;
    for attempt in 0..5 {
        let id = format!("sum-{attempt}");
        let total = quick_sum(steps).on(&keiro).id(&id).await.unwrap();
        assert_eq!(total, steps * (steps + 1) / 2);
        let written = written_at(&keiro, &id).await;
        let seqs: Vec<i64> = written.iter().map(|&(seq, _)| seq).collect();
        assert_eq!(seqs, (0..i64::from(steps)).collect::<Vec<_>>());
        let ended = updated_at(&keiro, &id).await;
        for &(seq, at) in &written {
            assert!(
                at <= ended,
                "attempt {attempt}: step #{seq} was written {} µs after the end",
                at - ended
            );
        }
        if written.last().map(|&(_, at)| at) == Some(ended) {
            together += 1;
        }
    }
    assert!(
        together >= 1,
        "in no run of five did the last rows commit with the end"
    );
    keiro.shutdown().await.unwrap();
}

/// How many steps [`links`] runs.
const LINKS: u32 = 30;
/// The step of [`links`] whose row "another executor" journals first.
const TAKEN: i64 = 2;

/// `prev` with `k` appended, so each value records the values before it.
/// Step 0 first journals step [`TAKEN`] of the run itself, with another
/// value, as an executor that took the instance over would have, then
/// holds the journal (see [`hold_journal`]).
#[step]
async fn link(url: String, id: String, prev: String, k: u32) -> String {
    if k == 0 {
        let store = stores()
            .lock()
            .unwrap()
            .get(&url)
            .cloned()
            .expect("registered store");
        let theirs = StepRow {
            workflow_id: id,
            generation: 0,
            seq: TAKEN,
            name: "link".into(),
            kind: "step".into(),
            result: "\"theirs\"".into(),
        };
        store
            .append_steps(&[theirs])
            .await
            .expect("journal their row");
        hold_journal(store).await;
    }
    format!("{prev}>{k}")
}

/// Holds the journal's write lock for 300 ms, on a task of its own, from
/// before this returns: the flush of step 0's row waits for it, and the
/// steps after queue meanwhile, so rows 1 to the last reach the writer as
/// one batch, with step [`TAKEN`]'s row inside it.
async fn hold_journal(store: Store) {
    let hold = Duration::from_millis(300);
    let (held, taken) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        match store {
            Store::Sqlite(s) => {
                let tx = s.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
                let _ = held.send(());
                tokio::time::sleep(hold).await;
                tx.rollback().await.unwrap();
            }
            Store::Postgres(s) => {
                let mut tx = s.pool().begin().await.unwrap();
                sqlx::query("LOCK TABLE keiro.steps IN SHARE MODE")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let _ = held.send(());
                tokio::time::sleep(hold).await;
                tx.rollback().await.unwrap();
            }
        }
    });
    taken.await.expect("the journal is held");
}

/// [`LINKS`] steps, each building on the one before; then, if `wait`, a
/// wait for a message (a barrier: the rows queued so far are flushed as a
/// batch, rather than committed with the run's end).
#[workflow(journal = "pipelined")]
async fn links(url: String, id: String, wait: bool) -> Result<String, String> {
    let mut value = String::from("start");
    for k in 0..LINKS {
        value = link(url.clone(), id.clone(), value, k).await;
    }
    if wait {
        keiro::recv::<()>("go").await.map_err(|e| e.to_string())?;
    }
    Ok(value)
}

async fn no_row_lands_behind_one_journaled_first(backend: Backend) {
    let db = TestDb::new(backend).await;
    // A lease far longer than the test: an instance runs on within it only
    // if the stopped run released it.
    let keiro = db
        .builder()
        .journal(Journal::Strict)
        .lease_ttl(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let store = keiro::unstable::raw_store(&keiro).clone();
    stores()
        .lock()
        .unwrap()
        .insert(db.url.clone(), store.clone());
    // Step TAKEN's value in the journal is "theirs", and every step after it
    // must build on that: a run that resumes from the journal does, while
    // the first run's rows after TAKEN ("start>0>1>2>3" …) must never land,
    // neither in the batch that met "theirs" (with a barrier, rows 1 to the
    // last are flushed as one batch) nor with the run's end (without one).
    let journal: Vec<String> = ["\"start>0\"".to_owned(), "\"start>0>1\"".to_owned()]
        .into_iter()
        .chain(
            (TAKEN..i64::from(LINKS)).scan("theirs".to_owned(), |value, k| {
                if k > TAKEN {
                    *value = format!("{value}>{k}");
                }
                Some(format!("\"{value}\""))
            }),
        )
        .collect();
    let steps = |id: &'static str| {
        let store = store.clone();
        async move {
            let rows = store.load_journal(id, 0).await.unwrap();
            rows.into_iter()
                .filter(|row| row.kind == "step")
                .map(|row| row.result)
                .collect::<Vec<_>>()
        }
    };
    // With a barrier the first run's rows 0 and 1 were flushed before the
    // batch that met "theirs"; without, the rows still queued went with its
    // end, which wrote none of them.
    for (id, wait) in [("flushed", true), ("ending", false)] {
        let handle = links(db.url.clone(), id.into(), wait)
            .on(&keiro)
            .id(id)
            .start()
            .await
            .unwrap();
        // The run stops when its write meets step TAKEN's row: it lost its
        // lease, so it records no end; it still held the lease (the row came
        // from no other worker), and releases it once it let go of the
        // instance in this process.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let row = store.get_instance(id).await.unwrap().unwrap();
            if row.lease_owner.is_none() {
                assert_eq!(row.status, keiro_store::InstanceStatus::Running, "{id}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{id}: the stopped run kept its lease"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let first = steps(id).await;
        let kept = first.len() - 1;
        assert!(
            first[..kept] == journal[..kept] && first[kept] == journal[TAKEN as usize],
            "{id}: the first run's rows, then theirs: {first:?}"
        );
        if wait {
            assert_eq!(kept, TAKEN as usize, "{id}: {first:?}");
        }
        // A pass of this process claiming it the moment it is released runs
        // it on from that journal: the run let go of it here first (a pass
        // finding it still driven here would leave it to its 60 s lease).
        let pass = keiro.resume_once(&ResumeOptions::default()).await.unwrap();
        assert_eq!((pass.resumed, pass.lease_skipped), (1, 0), "{id}: {pass:?}");
        let worker = keiro
            .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
            .await
            .unwrap();
        if wait {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while store.get_instance(id).await.unwrap().unwrap().status
                != keiro_store::InstanceStatus::Suspended
            {
                assert!(std::time::Instant::now() < deadline, "{id} never waited");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            keiro.send(id, "go", &()).await.unwrap();
        }
        let value = tokio::time::timeout(Duration::from_secs(10), handle.result())
            .await
            .unwrap_or_else(|_| panic!("{id} did not end"))
            .unwrap();
        let last = journal.last().cloned();
        assert_eq!(value.ok().map(|v| format!("\"{v}\"")), last, "{id}");
        assert_eq!(steps(id).await, journal, "{id}");
        worker.stop().await;
    }
    keiro.shutdown().await.unwrap();
}

on_both_backends!(
    no_row_lands_behind_one_journaled_first,
    steps_run_ahead_only_when_pipelined,
    an_event_is_visible_only_after_the_rows_before_it,
    the_last_rows_of_a_pipelined_run_commit_with_its_end,
);
