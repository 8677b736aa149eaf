//! The reads that pick instances by due order or run order use their
//! indexes, with or without statistics, so their cost grows with what they
//! return, not with how many instances wait.
//!
//! Without named indexes SQLite read every unfinished instance by status and
//! sorted them for each claim of the default queue, read them all for the
//! earliest wake-up time and for the count of pending awakeables (at every
//! resume pass) and for each cancellation, and its queue claims counted
//! every running instance of the database. With statistics (an
//! application may run `ANALYZE` or `PRAGMA optimize` on the database it
//! shares with keiro), SQLite 3.40 read every due row of the table and
//! sorted them for each queue hand-over. See `Dialect::indexed_by`.

use sqlx::Row;

use crate::{Store, StoreOptions};

/// Instances of the default queue and of one named queue: finished, running,
/// suspended and waiting.
const ROWS: usize = 4_000;

/// How SQLite plans `statement` (its parameters unbound), one line per step.
async fn plan(store: &Store, statement: &str) -> Vec<String> {
    let Store::Sqlite(s) = store else {
        unreachable!("a SQLite store")
    };
    sqlx::query(&format!("EXPLAIN QUERY PLAN {statement}"))
        .fetch_all(s.pool())
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<String, _>("detail"))
        .collect()
}

/// A statement checked: its name, its text, the aliases it gives the
/// workflows table, the indexes it may read that table by, and whether it
/// may sort (a sort of what the indexed read returned, not of the table).
type Checked = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    bool,
);

/// The statements checked.
fn checked() -> Vec<Checked> {
    const ID: &str = "sqlite_autoindex_keiro_workflows_1";
    const QUEUE: &[&str] = &[
        "keiro_workflows_queue_order",
        "keiro_workflows_queue_unfinished",
        "keiro_workflows_queue_running",
        "keiro_workflows_queue_held",
        "keiro_workflows_queue_started",
        ID,
    ];
    const TABLE: &[&str] = &["keiro_workflows"];
    const QUEUE_ALIASES: &[&str] = &["keiro_workflows", "c", "x", "f"];
    let sql = &*super::SQL;
    vec![
        (
            "claim_due",
            &sql.claim_due,
            TABLE,
            &["keiro_workflows_default_due", ID],
            false,
        ),
        (
            "find_due",
            &sql.find_due,
            TABLE,
            &["keiro_workflows_unfinished"],
            false,
        ),
        // Sorts the few blocked rows it keeps of the first scanned.
        (
            "find_blocked",
            &sql.find_blocked,
            TABLE,
            &["keiro_workflows_unfinished"],
            true,
        ),
        (
            "next_wake_at",
            &sql.next_wake_at,
            TABLE,
            &["keiro_workflows_unfinished"],
            false,
        ),
        (
            "count_pending_awakeables",
            &sql.count_pending_awakeables,
            &["w"],
            &[ID],
            false,
        ),
        (
            "unfinished_tree",
            &sql.unfinished_tree,
            &["w"],
            &[ID, "keiro_workflows_parent"],
            false,
        ),
        (
            "hand_over",
            &sql.queue.hand_over,
            QUEUE_ALIASES,
            QUEUE,
            false,
        ),
        (
            "hand_over_partition",
            &sql.queue.hand_over_partition,
            QUEUE_ALIASES,
            QUEUE,
            false,
        ),
        (
            "claim_partition",
            &sql.queue.claim_partition,
            QUEUE_ALIASES,
            QUEUE,
            false,
        ),
        (
            "claim_started",
            &sql.queue.claim_started,
            QUEUE_ALIASES,
            QUEUE,
            false,
        ),
        (
            "claim_fresh",
            &sql.queue.claim_fresh,
            QUEUE_ALIASES,
            QUEUE,
            false,
        ),
        // Sorts its partitions.
        ("rooms", &sql.queue.rooms, QUEUE_ALIASES, QUEUE, true),
        (
            "past_deadline",
            &sql.queue.past_deadline,
            TABLE,
            &["keiro_workflows_queue_deadline"],
            false,
        ),
    ]
}

#[tokio::test]
async fn due_and_queue_reads_keep_to_their_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("plans.db").display());
    let store = Store::connect(&url, &StoreOptions::default())
        .await
        .unwrap();
    let Store::Sqlite(s) = &store else {
        unreachable!("a sqlite: URL opens SQLite")
    };
    // Every fourth finished; of the rest a few running, some suspended;
    // half of all on queue `q`; every fifth the child of the one before;
    // each with a journal of three steps, the second of every seventh an
    // awakeable (answered when the third is there: every other one).
    sqlx::query(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
         INSERT INTO keiro_workflows (id, name, status, input, created_at, updated_at, \
             wake_at, queue, partition_key, lease_owner, lease_expires_at) \
         SELECT 'w-' || i, 'w', \
             CASE WHEN i % 4 = 0 THEN 'completed' WHEN i % 97 = 1 THEN 'running' \
                 WHEN i % 10 = 3 THEN 'suspended' ELSE 'pending' END, \
             '1', i, i, CASE WHEN i % 4 = 0 THEN NULL ELSE i END, \
             CASE WHEN i % 2 = 0 THEN 'q' END, '', \
             CASE WHEN i % 97 = 1 THEN 'me' END, CASE WHEN i % 97 = 1 THEN 1000000 END \
         FROM n; \
         UPDATE keiro_workflows SET parent_id = 'w-' || (CAST(substr(id, 3) AS INTEGER) - 1) \
             WHERE CAST(substr(id, 3) AS INTEGER) % 5 = 1; \
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {steps}) \
         INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, created_at) \
         SELECT 'w-' || (i / 3), 0, i % 3, 's', \
             CASE WHEN i % 3 = 1 AND (i / 3) % 7 = 0 THEN 'awakeable' ELSE 'step' END, '1', i \
         FROM n WHERE i % 3 < 2 OR (i / 3) % 2 = 0",
        last = ROWS - 1,
        steps = 3 * ROWS - 1
    ))
    .execute(s.pool())
    .await
    .unwrap();
    for statistics in [false, true] {
        if statistics {
            sqlx::query("ANALYZE").execute(s.pool()).await.unwrap();
        }
        for (name, statement, aliases, indexes, may_sort) in checked() {
            let plan = plan(&store, statement).await;
            for line in &plan {
                let on_workflows = aliases.iter().any(|alias| {
                    ["SEARCH", "SCAN"].iter().any(|read| {
                        let read = format!("{read} {alias}");
                        line.starts_with(&format!("{read} ")) || *line == read
                    })
                });
                let by_index = indexes.iter().any(|index| {
                    let by = format!("INDEX {index}");
                    line.contains(&format!("{by} ")) || line.ends_with(&by)
                });
                assert!(
                    !on_workflows || by_index,
                    "{name} (statistics: {statistics}) reads the workflows table by \
                     `{line}`:\n{plan:#?}"
                );
            }
            assert!(
                may_sort || !plan.iter().any(|line| line.contains("TEMP B-TREE")),
                "{name} (statistics: {statistics}) sorts what it read:\n{plan:#?}"
            );
        }
    }
}
