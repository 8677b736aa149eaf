//! Retention on both backends: `keiro.gc` deletes finished trees, old
//! generations and finished timers by age, keeps everything unfinished, and
//! counts the same in a dry run.

use std::time::Duration;

use keiro::{step, workflow, GcSummary, Keiro, Retention};
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

/// Runs `text` on `keiro`'s database, `{t}` standing for the table prefix
/// (`keiro_` or `keiro.`); returns the rows it changed.
async fn sql(keiro: &Keiro, text: &str) -> u64 {
    let store = keiro.store();
    if let Some(pool) = store.sqlite_pool() {
        let text = text.replace("{t}", "keiro_");
        return sqlx::query(&text)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected();
    }
    let pool = store.postgres_pool().expect("a SQLite or PostgreSQL store");
    let text = text.replace("{t}", "keiro.");
    sqlx::query(&text)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
}

/// The value of `SELECT count(*) …` (`{t}` as in [`sql`]).
async fn count(keiro: &Keiro, text: &str) -> i64 {
    let store = keiro.store();
    if let Some(pool) = store.sqlite_pool() {
        let text = text.replace("{t}", "keiro_");
        return sqlx::query_scalar(&text).fetch_one(pool).await.unwrap();
    }
    let pool = store.postgres_pool().expect("a SQLite or PostgreSQL store");
    let text = text.replace("{t}", "keiro.");
    sqlx::query_scalar(&text).fetch_one(pool).await.unwrap()
}

/// Moves instance `id`'s last change `secs` seconds into the past.
async fn age(keiro: &Keiro, id: &str, secs: i64) {
    let changed = sql(
        keiro,
        &format!(
            "UPDATE {{t}}workflows SET updated_at = updated_at - {} WHERE id = '{id}'",
            secs * 1_000_000
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
    instance(keiro, "family/2", Some("family"), "failed", 0, old).await;
    steps(keiro, "family/2", 0, 1, 1, old).await;
    instance(keiro, "family/1/1", Some("family/1"), "completed", 0, old).await;
    steps(keiro, "family/1/1", 0, 1, 1, old).await;
    message(keiro, "family/1/1", Some(0), old).await;
    // A finished root whose child still runs: both kept.
    instance(keiro, "detached", None, "completed", 0, old).await;
    instance(keiro, "detached/1", Some("detached"), "running", 0, old).await;
    steps(keiro, "detached/1", 0, 1, 1, old).await;
    // Finished, but too young: kept.
    instance(keiro, "young", None, "completed", 0, young).await;
    steps(keiro, "young", 0, 1, 1, young).await;
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
    let store = keiro.store();
    if let Some(pool) = store.sqlite_pool() {
        let text = text.replace("{t}", "keiro_");
        return sqlx::query_scalar(&text).fetch_all(pool).await.unwrap();
    }
    let pool = store.postgres_pool().expect("a SQLite or PostgreSQL store");
    let text = text.replace("{t}", "keiro.");
    sqlx::query_scalar(&text).fetch_all(pool).await.unwrap()
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
            "pending-root",
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

on_both_backends!(
    old_finished_instances_go_new_ones_stay,
    gc_keeps_everything_unfinished_and_deletes_finished_trees,
    dry_run_counts_what_a_real_run_then_deletes,
    invalid_retention_is_refused,
);
