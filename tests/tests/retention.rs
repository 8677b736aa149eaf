//! Retention on both backends: `keiro.gc` deletes finished trees, old
//! generations and finished timers by age, keeps everything unfinished, and
//! counts the same in a dry run.

use std::time::Duration;

use keiro::{step, workflow, Keiro, Retention};
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

on_both_backends!(old_finished_instances_go_new_ones_stay);
