//! Retention on both backends: `keiro.gc` deletes finished trees, old
//! generations and finished timers by age, keeps everything unfinished, and
//! counts the same in a dry run.

use std::time::Duration;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use keiro::{
    step, workflow, GcSummary, Keiro, ResumeEvent, ResumeOptions, Retention, WorkflowStatus,
};
use keiro_store::now_us;
use keiro_tests::{on_both_backends, Backend, TestDb};

#[step]
async fn add(a: u32, b: u32) -> Result<u32, String> {
    Ok(a + b)
}

#[workflow]
async fn three_adds(n: u32) -> Result<u32, String> {
    let a = add(n, 1).await?;
    let b = add(a, 1).await?;
    add(b, 1).await
}

/// Runs `$body` with `$pool` bound to `$keiro`'s pool and `$sql` to
/// `$text` with `{t}` replaced by the backend's table prefix (`keiro_` or
/// `keiro.`).
macro_rules! on_pool {
    ($keiro:expr, $text:expr, |$pool:ident, $sql:ident| $body:expr) => {{
        let store = $keiro.store();
        match (store.sqlite_pool(), store.postgres_pool()) {
            (Some($pool), _) => {
                let $sql = $text.replace("{t}", "keiro_");
                $body
            }
            (_, Some($pool)) => {
                let $sql = $text.replace("{t}", "keiro.");
                $body
            }
            (None, None) => unreachable!("a store is SQLite or PostgreSQL"),
        }
    }};
}

/// Runs `text` (`{t}`: the table prefix); returns the rows it changed.
async fn sql(keiro: &Keiro, text: &str) -> u64 {
    on_pool!(keiro, text, |pool, text| sqlx::query(&text)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected())
}

/// The value of `SELECT count(*) …` (`{t}`: the table prefix).
async fn count(keiro: &Keiro, text: &str) -> i64 {
    on_pool!(keiro, text, |pool, text| sqlx::query_scalar(&text)
        .fetch_one(pool)
        .await
        .unwrap())
}

/// Moves instance `id`'s creation and last change `secs` seconds into the
/// past.
async fn age(keiro: &Keiro, id: &str, secs: i64) {
    let changed = sql(
        keiro,
        &format!(
            "UPDATE {{t}}workflows SET created_at = created_at - {us}, \
             updated_at = updated_at - {us} WHERE id = '{id}'",
            us = secs * 1_000_000
        ),
    )
    .await;
    assert_eq!(changed, 1, "instance {id} exists");
}

async fn exists(keiro: &Keiro, id: &str) -> bool {
    count(
        keiro,
        &format!("SELECT count(*) FROM {{t}}workflows WHERE id = '{id}'"),
    )
    .await
        == 1
}

const HOUR: Duration = Duration::from_secs(3600);

async fn old_finished_instances_go_new_ones_stay(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    for n in 0..3 {
        let id = format!("old-{n}");
        assert_eq!(
            three_adds(n).id(id.as_str()).on(&keiro).await.unwrap(),
            Ok(n + 3)
        );
        age(&keiro, &id, 7200).await;
    }
    assert_eq!(three_adds(9).id("new").on(&keiro).await.unwrap(), Ok(12));
    let summary = keiro
        .gc(&Retention::finished_older_than(HOUR))
        .await
        .unwrap();
    assert_eq!((summary.instances, summary.steps), (3, 9), "{summary:?}");
    for n in 0..3 {
        assert!(!exists(&keiro, &format!("old-{n}")).await);
    }
    assert!(exists(&keiro, "new").await);
    assert_eq!(count(&keiro, "SELECT count(*) FROM {t}steps").await, 3);
}

/// µs in a minute and an hour.
const MINUTE_US: i64 = 60_000_000;
const HOUR_US: i64 = 60 * MINUTE_US;

/// Inserts instance `id` (child of `parent`, if any) with `status` and
/// `generation`, last changed at `updated_at` (µs).
async fn instance(
    keiro: &Keiro,
    id: &str,
    parent: Option<&str>,
    status: &str,
    generation: i64,
    updated_at: i64,
) {
    let parent = parent.map_or("NULL".to_owned(), |p| format!("'{p}'"));
    sql(
        keiro,
        &format!(
            "INSERT INTO {{t}}workflows (id, name, generation, status, input, attempts, \
             parent_id, parent_seq, parent_generation, created_at, updated_at) VALUES \
             ('{id}', 'fixture', {generation}, '{status}', '[]', 0, {parent}, \
             CASE WHEN {parent} IS NULL THEN NULL ELSE 1 END, \
             CASE WHEN {parent} IS NULL THEN NULL ELSE 0 END, {updated_at}, {updated_at})"
        ),
    )
    .await;
}

/// Inserts `n` journal rows of `id`'s `generation` from seq `from`, created at `at`.
async fn steps(keiro: &Keiro, id: &str, generation: i64, from: i64, n: i64, at: i64) {
    for seq in from..from + n {
        sql(
            keiro,
            &format!(
                "INSERT INTO {{t}}steps (workflow_id, generation, seq, name, kind, result, \
                 created_at) VALUES ('{id}', {generation}, {seq}, 'add', 'step', \
                 '{{\"ok\":1}}', {at})"
            ),
        )
        .await;
    }
}

/// Sends a message to `id`, consumed by `consumed` (generation) at `at`, or
/// waiting.
async fn message(keiro: &Keiro, id: &str, consumed: Option<i64>, at: i64) {
    let (generation, seq, when) = match consumed {
        Some(generation) => (generation.to_string(), "1".to_owned(), at.to_string()),
        None => ("NULL".into(), "NULL".into(), "NULL".into()),
    };
    sql(
        keiro,
        &format!(
            "INSERT INTO {{t}}messages (workflow_id, topic, payload, sent_at, \
             consumed_generation, consumed_seq, consumed_at) VALUES \
             ('{id}', 'inbox', '1', {at}, {generation}, {seq}, {when})"
        ),
    )
    .await;
}

async fn event(keiro: &Keiro, id: &str, key: &str, at: i64) {
    sql(
        keiro,
        &format!(
            "INSERT INTO {{t}}events (workflow_id, key, value, updated_at) \
             VALUES ('{id}', '{key}', '1', {at})"
        ),
    )
    .await;
}

async fn stream_entry(keiro: &Keiro, id: &str, position: i64, at: i64) {
    sql(
        keiro,
        &format!(
            "INSERT INTO {{t}}streams (workflow_id, key, position, value, written_at) \
             VALUES ('{id}', 'log', {position}, '1', {at})"
        ),
    )
    .await;
}

async fn timer(keiro: &Keiro, id: &str, status: &str, at: i64) {
    sql(
        keiro,
        &format!(
            "INSERT INTO {{t}}timers (id, process_manager, correlation_id, fire_at, payload, \
             status, attempts, created_at, updated_at) VALUES \
             ('{id}', 'billing', '{id}', {at}, '{{}}', '{status}', 0, {at}, {at})"
        ),
    )
    .await;
}

/// Every live and dead shape gc meets, aged against a 1 h cutoff (failed and
/// cancelled ones: 3 h). Returns what gc must delete.
async fn fixture(keiro: &Keiro) -> GcSummary {
    let now = now_us();
    let (old, older, young) = (now - 2 * HOUR_US, now - 4 * HOUR_US, now - MINUTE_US);
    // An unfinished root, old, with a journal, a message and an event: kept.
    instance(keiro, "pending-root", None, "pending", 0, old).await;
    steps(keiro, "pending-root", 0, 1, 2, old).await;
    message(keiro, "pending-root", None, old).await;
    event(keiro, "pending-root", "stage", old).await;
    // A suspended parent with a finished child: both kept.
    instance(keiro, "waiting", None, "suspended", 0, old).await;
    steps(keiro, "waiting", 0, 1, 1, old).await;
    instance(keiro, "waiting/1", Some("waiting"), "completed", 0, old).await;
    steps(keiro, "waiting/1", 0, 1, 2, old).await;
    // A finished family, three levels: all deleted with everything theirs.
    instance(keiro, "family", None, "completed", 0, old).await;
    steps(keiro, "family", 0, 1, 2, old).await;
    message(keiro, "family", None, old).await;
    instance(keiro, "family/1", Some("family"), "completed", 0, old).await;
    steps(keiro, "family/1", 0, 1, 2, old).await;
    event(keiro, "family/1", "stage", old).await;
    stream_entry(keiro, "family/1", 0, old).await;
    stream_entry(keiro, "family/1", 1, old).await;
    // (Failed 4 h ago: past the failed instances' own, longer cutoff.)
    instance(keiro, "family/2", Some("family"), "failed", 0, older).await;
    steps(keiro, "family/2", 0, 1, 1, old).await;
    instance(keiro, "family/1/1", Some("family/1"), "completed", 0, old).await;
    steps(keiro, "family/1/1", 0, 1, 1, old).await;
    message(keiro, "family/1/1", Some(0), old).await;
    // A finished root whose child still runs: both kept.
    instance(keiro, "detached", None, "completed", 0, old).await;
    instance(keiro, "detached/1", Some("detached"), "running", 0, old).await;
    steps(keiro, "detached/1", 0, 1, 1, old).await;
    // An old finished root whose child (a queued job it enqueued, say)
    // finished a minute ago: kept, root and child, until the child is old
    // enough too; so is one whose failed child is older than the finished
    // cutoff, not the failed one.
    instance(keiro, "recent-child", None, "completed", 0, old).await;
    instance(
        keiro,
        "recent-child/1",
        Some("recent-child"),
        "completed",
        0,
        young,
    )
    .await;
    instance(keiro, "failed-child", None, "completed", 0, old).await;
    instance(
        keiro,
        "failed-child/1",
        Some("failed-child"),
        "failed",
        0,
        old,
    )
    .await;
    // Finished, but too young: kept.
    instance(keiro, "young", None, "completed", 0, young).await;
    steps(keiro, "young", 0, 1, 1, young).await;
    // Created long ago, finished a minute ago: kept (age is the last change).
    instance(keiro, "late-finish", None, "completed", 0, young).await;
    sql(
        keiro,
        &format!("UPDATE {{t}}workflows SET created_at = {older} WHERE id = 'late-finish'"),
    )
    .await;
    instance(keiro, "timed-out", None, "timed_out", 0, old).await;
    // Failed and cancelled ones age by their own, longer cutoff.
    instance(keiro, "failed-2h", None, "failed", 0, old).await;
    instance(keiro, "cancelled-2h", None, "cancelled", 0, old).await;
    instance(keiro, "failed-4h", None, "failed", 0, older).await;
    steps(keiro, "failed-4h", 0, 1, 1, older).await;
    instance(keiro, "cancelled-4h", None, "cancelled", 0, older).await;
    // Set aside for non-determinism: never deleted.
    instance(keiro, "set-aside", None, "nondeterministic", 0, older).await;
    // Continued as new three times, still running: old generations' rows
    // older than the cutoff go (and the messages they consumed), the current
    // generation's stay whatever their age.
    instance(keiro, "continued", None, "running", 3, old).await;
    steps(keiro, "continued", 0, 1, 2, old).await;
    steps(keiro, "continued", 1, 1, 2, old).await;
    steps(keiro, "continued", 2, 1, 1, old).await;
    steps(keiro, "continued", 2, 2, 1, young).await;
    steps(keiro, "continued", 3, 1, 2, old).await;
    message(keiro, "continued", Some(1), old).await;
    message(keiro, "continued", Some(3), old).await;
    message(keiro, "continued", None, old).await;
    // Continued as new and then finished: goes whole, every generation
    // counted with its instance.
    instance(keiro, "continued-done", None, "completed", 2, old).await;
    steps(keiro, "continued-done", 0, 1, 2, old).await;
    steps(keiro, "continued-done", 2, 1, 1, old).await;
    message(keiro, "continued-done", Some(0), old).await;
    // Process-manager timers: only fired and cancelled old ones go.
    timer(keiro, "t-fired-old", "fired", old).await;
    timer(keiro, "t-cancelled-old", "cancelled", old).await;
    timer(keiro, "t-fired-young", "fired", young).await;
    for status in ["scheduled", "firing", "dead", "resuming"] {
        timer(keiro, &format!("t-{status}-old"), status, old).await;
    }
    let mut gone = GcSummary::default();
    // family ×4, timed-out, failed-4h, cancelled-4h, continued-done
    gone.instances = 8;
    // family 2 + family/1 2 + family/2 1 + family/1/1 1, failed-4h 1,
    // continued-done 3
    gone.steps = 10;
    // family's waiting one, family/1/1's consumed one, continued's gen-1
    // one, continued-done's
    gone.messages = 4;
    gone.events = 1;
    gone.stream_entries = 2;
    gone.timers = 2;
    // continued: gen 0 ×2, gen 1 ×2, gen 2's old one
    gone.old_generation_steps = 5;
    gone
}

fn retention() -> Retention {
    Retention::finished_older_than(HOUR).failed_older_than(3 * HOUR)
}

/// `summary` without its batch count.
fn counts(summary: &GcSummary) -> GcSummary {
    let mut counts = summary.clone();
    counts.batches = 0;
    counts
}

/// The ids of every row of `table` (its `column`), sorted.
async fn ids(keiro: &Keiro, table: &str, column: &str) -> Vec<String> {
    let text = format!("SELECT {column} FROM {{t}}{table} ORDER BY {column}");
    on_pool!(keiro, text, |pool, text| sqlx::query_scalar(&text)
        .fetch_all(pool)
        .await
        .unwrap())
}

/// A picture of every table gc touches.
async fn snapshot(keiro: &Keiro) -> Vec<(String, i64)> {
    let mut counts = Vec::new();
    for table in [
        "workflows",
        "steps",
        "messages",
        "events",
        "streams",
        "timers",
    ] {
        let n = count(keiro, &format!("SELECT count(*) FROM {{t}}{table}")).await;
        counts.push((table.to_owned(), n));
    }
    counts
}

async fn gc_keeps_everything_unfinished_and_deletes_finished_trees(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let gone = fixture(&keiro).await;
    // Batches of 2 roots: trees, keyset pages and phases cross batches.
    let summary = keiro.gc(&retention().batch_size(2)).await.unwrap();
    assert_eq!(counts(&summary), gone, "{summary:?}");
    assert!(summary.batches > 3, "{summary:?}");
    assert_eq!(
        ids(&keiro, "workflows", "id").await,
        [
            "cancelled-2h",
            "continued",
            "detached",
            "detached/1",
            "failed-2h",
            "failed-child",
            "failed-child/1",
            "late-finish",
            "pending-root",
            "recent-child",
            "recent-child/1",
            "set-aside",
            "waiting",
            "waiting/1",
            "young"
        ]
    );
    let journal = |id: &'static str| {
        let keiro = keiro.clone();
        async move {
            count(
                &keiro,
                &format!("SELECT count(*) FROM {{t}}steps WHERE workflow_id = '{id}'"),
            )
            .await
        }
    };
    assert_eq!(journal("pending-root").await, 2);
    assert_eq!(journal("waiting").await, 1);
    assert_eq!(journal("waiting/1").await, 2);
    assert_eq!(journal("detached/1").await, 1);
    assert_eq!(journal("young").await, 1);
    // continued: gen 2's young row and gen 3's two rows.
    assert_eq!(
        count(
            &keiro,
            "SELECT count(*) FROM {t}steps WHERE workflow_id = 'continued' AND generation < 3"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &keiro,
            "SELECT count(*) FROM {t}steps WHERE workflow_id = 'continued' AND generation = 3"
        )
        .await,
        2
    );
    assert_eq!(
        ids(&keiro, "messages", "workflow_id").await,
        ["continued", "continued", "pending-root"]
    );
    assert_eq!(
        count(
            &keiro,
            "SELECT count(*) FROM {t}messages WHERE workflow_id = 'continued' \
             AND consumed_generation = 1"
        )
        .await,
        0
    );
    assert_eq!(ids(&keiro, "events", "workflow_id").await, ["pending-root"]);
    assert_eq!(count(&keiro, "SELECT count(*) FROM {t}streams").await, 0);
    assert_eq!(
        ids(&keiro, "timers", "id").await,
        [
            "t-dead-old",
            "t-fired-young",
            "t-firing-old",
            "t-resuming-old",
            "t-scheduled-old"
        ]
    );
    // A second run finds nothing more.
    let again = keiro.gc(&retention()).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
}

/// Runs gc under `policy` batch by batch: the instances each batch that
/// deleted any deleted.
async fn instances_per_batch(keiro: &Keiro, policy: keiro_store::GcPolicy) -> Vec<u64> {
    let store = keiro::unstable::raw_store(keiro);
    let mut cursor = Some(keiro_store::GcCursor::default());
    let mut per_batch = Vec::new();
    while let Some(at) = cursor.take() {
        let request = keiro_store::GcRequest { policy, cursor: at };
        let progress = store.gc_batch(request).await.unwrap();
        per_batch.push(progress.summary.instances);
        cursor = progress.next;
        assert!(per_batch.len() < 10, "gc did not end: {per_batch:?}");
    }
    per_batch.retain(|&n| n > 0);
    per_batch
}

async fn a_batch_holds_whole_trees_of_at_most_batch_size_instances(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let old = now_us() - 2 * HOUR_US;
    // A root with five children, then three lone roots, all finished long
    // ago, in that order.
    instance(&keiro, "big", None, "completed", 0, old).await;
    for n in 0..5 {
        instance(
            &keiro,
            &format!("big-{n}"),
            Some("big"),
            "completed",
            0,
            old,
        )
        .await;
    }
    for n in 1..=3 {
        instance(&keiro, &format!("lone-{n}"), None, "completed", 0, old + n).await;
    }
    let policy = keiro_store::GcPolicy {
        finished_before: now_us() - HOUR_US,
        failed_before: now_us() - HOUR_US,
        batch_size: 3,
        dry_run: false,
    };
    let per_batch = instances_per_batch(&keiro, policy).await;
    // The big tree alone (larger than a batch, it goes whole), then the three
    // lone roots: never a tree split, never more than 3 beside another tree.
    assert_eq!(per_batch, [6, 3]);
    assert_eq!(count(&keiro, "SELECT count(*) FROM {t}workflows").await, 0);

    // A page longer than the trees read at a time: a root with 45 children,
    // then 45 lone roots, in batches of 40.
    instance(&keiro, "huge", None, "completed", 0, old).await;
    for n in 0..45 {
        instance(
            &keiro,
            &format!("huge-{n}"),
            Some("huge"),
            "completed",
            0,
            old,
        )
        .await;
        instance(
            &keiro,
            &format!("alone-{n:02}"),
            None,
            "completed",
            0,
            old + 1 + n,
        )
        .await;
    }
    let policy = keiro_store::GcPolicy {
        batch_size: 40,
        ..policy
    };
    let per_batch = instances_per_batch(&keiro, policy).await;
    // The huge tree alone; then 40 lone roots, then the last 5: none skipped.
    assert_eq!(per_batch, [46, 40, 5]);
    assert_eq!(count(&keiro, "SELECT count(*) FROM {t}workflows").await, 0);
}

async fn dry_run_counts_what_a_real_run_then_deletes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let gone = fixture(&keiro).await;
    let before = snapshot(&keiro).await;
    for batch_size in [1, 3, 500] {
        let dry = keiro
            .gc(&retention().batch_size(batch_size).dry_run())
            .await
            .unwrap();
        assert_eq!(counts(&dry), gone, "batch_size {batch_size}: {dry:?}");
        assert_eq!(snapshot(&keiro).await, before, "a dry run deletes nothing");
    }
    let dry = keiro
        .gc(&retention().batch_size(3).dry_run())
        .await
        .unwrap();
    let real = keiro.gc(&retention().batch_size(3)).await.unwrap();
    assert_eq!(real, dry, "the same counts, the same batches");
    assert_ne!(snapshot(&keiro).await, before);
}

async fn invalid_retention_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    for n in [0, keiro::MAX_GC_BATCH + 1] {
        let error = keiro
            .gc(&Retention::finished_older_than(HOUR).batch_size(n))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, keiro::Error::InvalidOption { option, .. } if *option == "Retention::batch_size"),
            "{error}"
        );
    }
}

/// Continues as new until `n` is 0, a step per generation, then waits on
/// an awakeable nobody resolves.
#[workflow]
async fn generations(n: u32) -> Result<u32, String> {
    add(n, 0).await?;
    if n > 0 {
        return keiro::continue_as_new(generations(n - 1))
            .await
            .map_err(|e| e.to_string())?;
    }
    keiro::awakeable::<u32>()
        .await
        .await
        .map_err(|e| e.to_string())
}

/// Waits (at most 20 s) until `done` holds.
async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn old_generations_of_a_running_instance_go_its_current_one_stays(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // The worker runs each generation after the first.
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(20)))
        .await
        .unwrap();
    let handle = generations(3)
        .id("gens")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let journal = |generation: i64| {
        let keiro = keiro.clone();
        async move {
            count(
                &keiro,
                &format!(
                    "SELECT count(*) FROM {{t}}steps WHERE workflow_id = 'gens' \
                     AND generation = {generation}"
                ),
            )
            .await
        }
    };
    // Generation 3 journaled its step and its awakeable.
    eventually("generation 3 to wait", || async { journal(3).await >= 2 }).await;
    let old: i64 = count(
        &keiro,
        "SELECT count(*) FROM {t}steps WHERE workflow_id = 'gens' AND generation < 3",
    )
    .await;
    assert!(
        old >= 3,
        "a step (and the continuation) per old generation: {old}"
    );
    let current = journal(3).await;
    sql(
        &keiro,
        "UPDATE {t}steps SET created_at = created_at - 7200000000",
    )
    .await;
    let summary = keiro
        .gc(&Retention::finished_older_than(HOUR))
        .await
        .unwrap();
    assert_eq!(summary.old_generation_steps, old as u64, "{summary:?}");
    assert_eq!(summary.instances, 0, "{summary:?}");
    for generation in 0..3 {
        assert_eq!(journal(generation).await, 0, "generation {generation}");
    }
    assert_eq!(journal(3).await, current, "the current generation is kept");
    let row = keiro.store().get_instance("gens").await.unwrap().unwrap();
    assert_eq!(row.generation, 3);
    let status = handle.status().await.unwrap();
    assert!(
        matches!(status, WorkflowStatus::Running | WorkflowStatus::Suspended),
        "{status:?}"
    );
    worker.shutdown().await;
}

/// Inserts `n` completed root instances `old-{i}`, three journal rows each,
/// last changed two hours ago.
async fn prefill_finished(keiro: &Keiro, n: u32) {
    let at = now_us() - 2 * HOUR_US;
    let series =
        format!("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n})");
    let inserted = sql(
        keiro,
        &format!(
            "{series} INSERT INTO {{t}}workflows (id, name, generation, status, input, output, \
             attempts, created_at, updated_at) \
             SELECT 'old-' || i, 'three_adds', 0, 'completed', '[1]', '{{\"Ok\":4}}', 0, {at}, {at} \
             FROM n"
        ),
    )
    .await;
    assert_eq!(inserted, u64::from(n));
    for seq in 1..=3 {
        sql(
            keiro,
            &format!(
                "{series} INSERT INTO {{t}}steps (workflow_id, generation, seq, name, kind, \
                 result, created_at) \
                 SELECT 'old-' || i, 0, {seq}, 'add', 'step', '{{\"Ok\":2}}', {at} FROM n"
            ),
        )
        .await;
    }
}

async fn a_worker_keeps_completing_workflows_while_a_large_gc_runs(backend: Backend) {
    const OLD: u32 = 20_000;
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    prefill_finished(&keiro, OLD).await;
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(20)))
        .await
        .unwrap();
    let gc = {
        let keiro = keiro.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let summary = keiro
                .gc(&Retention::finished_older_than(HOUR).batch_size(500))
                .await
                .unwrap();
            (summary, started.elapsed())
        })
    };
    // Waves of 20 enqueued workflows, each wave bounded in time, until gc
    // is done (at most 200 waves).
    let mut waves_beside_gc = 0;
    let mut started = 0;
    for wave in 0..200u32 {
        let mut handles = Vec::new();
        for k in 0..20u32 {
            let id = format!("new-{wave}-{k}");
            handles.push(three_adds(k).id(id).on(&keiro).enqueue().await.unwrap());
        }
        started += handles.len();
        let wave_started = Instant::now();
        for (k, handle) in handles.iter().enumerate() {
            let out = tokio::time::timeout(Duration::from_secs(30), handle.result())
                .await
                .unwrap_or_else(|_| panic!("wave {wave}: workflow {k} still running after 30 s"))
                .unwrap();
            assert_eq!(out, Ok(k as u32 + 3));
        }
        assert!(
            wave_started.elapsed() < Duration::from_secs(30),
            "wave {wave} took {:?}",
            wave_started.elapsed()
        );
        if gc.is_finished() {
            break;
        }
        waves_beside_gc += 1;
    }
    let (summary, took) = tokio::time::timeout(Duration::from_secs(120), gc)
        .await
        .expect("gc of 20,000 instances ends within 120 s")
        .unwrap();
    assert_eq!(summary.instances, u64::from(OLD), "{summary:?}");
    assert_eq!(summary.steps, 3 * u64::from(OLD), "{summary:?}");
    assert!(summary.batches >= 40, "{summary:?}");
    assert!(
        waves_beside_gc >= 1,
        "gc ({took:?}) ended before a wave of workflows completed"
    );
    assert_eq!(
        count(
            &keiro,
            "SELECT count(*) FROM {t}workflows WHERE id LIKE 'new-%'"
        )
        .await,
        started as i64,
        "every new workflow is kept"
    );
    assert_eq!(
        count(
            &keiro,
            "SELECT count(*) FROM {t}workflows WHERE id LIKE 'old-%'"
        )
        .await,
        0
    );
    worker.shutdown().await;
}

async fn the_worker_runs_gc_every_interval_and_survives_its_failures(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let events: Arc<Mutex<Vec<ResumeEvent>>> = Arc::default();
    let log = events.clone();
    let worker = keiro
        .resume_worker(
            ResumeOptions::default()
                // As short as this binary allows: `keiro_tests::queues`
                // declares a queue limiting its starts per second.
                .retention(Retention::finished_older_than(Duration::from_secs(1)))
                .gc_interval(Duration::from_millis(100))
                .log(move |event| {
                    if matches!(event, ResumeEvent::Gc(_) | ResumeEvent::GcFailed { .. }) {
                        log.lock().unwrap().push(event.clone());
                    }
                }),
        )
        .await
        .unwrap();
    assert_eq!(three_adds(1).id("first").on(&keiro).await.unwrap(), Ok(4));
    let deleted = || -> u64 {
        events
            .lock()
            .unwrap()
            .iter()
            .map(|event| match event {
                ResumeEvent::Gc(summary) => summary.instances,
                _ => 0,
            })
            .sum()
    };
    // A run reports once it is done, a little after its deletes commit.
    eventually("a gc run to report the first instance", || async {
        deleted() == 1
    })
    .await;
    assert!(!exists(&keiro, "first").await);

    // A failing gc is reported, and the worker goes on running workflows.
    sql(&keiro, "ALTER TABLE {t}timers RENAME TO timers_away").await;
    let failures = || {
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, ResumeEvent::GcFailed { .. }))
            .count()
    };
    eventually("a failed gc", || async { failures() >= 2 }).await;
    let handle = three_adds(2)
        .id("second")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(20), handle.result())
            .await
            .unwrap()
            .unwrap(),
        Ok(5)
    );
    let renamed = match backend {
        Backend::Sqlite => "ALTER TABLE timers_away RENAME TO keiro_timers",
        Backend::Postgres | Backend::PgBouncer => "ALTER TABLE keiro.timers_away RENAME TO timers",
    };
    sql(&keiro, renamed).await;
    // The next interval's gc succeeds again and deletes the second one.
    eventually("the second instance to go", || async {
        !exists(&keiro, "second").await
    })
    .await;
    worker.shutdown().await;
}

on_both_backends!(
    a_batch_holds_whole_trees_of_at_most_batch_size_instances,
    old_finished_instances_go_new_ones_stay,
    gc_keeps_everything_unfinished_and_deletes_finished_trees,
    dry_run_counts_what_a_real_run_then_deletes,
    invalid_retention_is_refused,
    old_generations_of_a_running_instance_go_its_current_one_stays,
    a_worker_keeps_completing_workflows_while_a_large_gc_runs,
    the_worker_runs_gc_every_interval_and_survives_its_failures,
);
