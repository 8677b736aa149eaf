//! Migration 0008 (every time column from milliseconds to microseconds), run
//! against both backends.
//!
//! Each case builds a database the way a release before 0008 left it:
//! migrated up to 0007 with sqlx's migrator restricted to those versions, then
//! seeded with rows whose times are milliseconds. Connecting a [`Store`] runs
//! the remaining migrations; the rows must then read back as the same instants
//! in microseconds, and what was due before the migration must still be due
//! (and what was not, not).

mod support;

use std::borrow::Cow;

use keiro_store::{now_us, Store, POSTGRES_MIGRATOR, SQLITE_MIGRATOR};
use keiro_test_support::{PgBouncer, PostgresServer, TEST_POSTGRES_URL_VAR};
use sqlx::migrate::Migrator;
use sqlx::{Connection, Executor};
use support::{create_postgres_database, drop_postgres_database, test_options};

/// The last migration whose times are milliseconds.
const LAST_MS_VERSION: i64 = 7;

/// A workflow sleeping "forever": a saturated microsecond deadline rounded up
/// to milliseconds, the largest `wake_at` a release before 0008 could write.
const NEVER_MS: i64 = i64::MAX / 1000 + 1;

/// `migrator` restricted to the migrations up to [`LAST_MS_VERSION`].
fn up_to_last_ms_version(migrator: &Migrator) -> Migrator {
    let migrations = migrator
        .migrations
        .iter()
        .filter(|m| m.version <= LAST_MS_VERSION)
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(
        migrations.len(),
        LAST_MS_VERSION as usize,
        "migrations 0001-0007"
    );
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

/// Rows as a release before 0008 stored them, every time in milliseconds
/// relative to `now` (ms since the Unix epoch). Written for SQLite's table
/// names; [`on_postgres`] renames them.
fn seed_statements(now: i64) -> Vec<String> {
    let workflow = |id: &str, status: &str, lease: &str, wake_at: i64| {
        format!(
            "INSERT INTO keiro_workflows (id, name, generation, status, input, attempts, \
             lease_owner, lease_expires_at, wake_at, created_at, updated_at) \
             VALUES ('{id}', 'checkout', 0, '{status}', '[]', 0, {lease}, {wake_at}, {}, {})",
            now - 60_000,
            now - 30_000,
        )
    };
    let timer = |id: &str, status: &str, fire_at: i64, claim: &str| {
        format!(
            "INSERT INTO keiro_timers (id, process_manager, correlation_id, fire_at, payload, \
             status, attempts, claimed_at, resume_token, resume_lease_until, created_at, \
             updated_at) VALUES ('{id}', 'pm', 'c', {fire_at}, '{{}}', '{status}', 0, {claim}, {}, {})",
            now - 60_000,
            now - 30_000,
        )
    };
    vec![
        workflow("due", "suspended", "NULL, NULL", now - 1_000),
        workflow("later", "suspended", "NULL, NULL", now + 3_600_000),
        workflow(
            "running",
            "running",
            &format!("'w', {}", now + 600_000),
            now + 600_000,
        ),
        workflow("never", "suspended", "NULL, NULL", NEVER_MS),
        format!(
            "INSERT INTO keiro_steps (workflow_id, generation, seq, name, kind, result, created_at) \
             VALUES ('due', 0, 0, 'sleep', 'sleep', '{{\"Ok\":1}}', {})",
            now - 50_000
        ),
        format!(
            "INSERT INTO keiro_executors (id, token, host, pid, heartbeat_at) \
             VALUES ('w', 'tok', 'host', 1, {})",
            now - 5_000
        ),
        timer("t-due", "scheduled", now - 1_000, "NULL, NULL, NULL"),
        timer("t-later", "scheduled", now + 3_600_000, "NULL, NULL, NULL"),
        timer(
            "t-resuming",
            "resuming",
            now - 120_000,
            &format!("{}, 'tok', {}", now - 90_000, now + 60_000),
        ),
    ]
}

/// `sql` with SQLite's `keiro_<table>` names as PostgreSQL's `keiro.<table>`.
fn on_postgres(sql: &str) -> String {
    ["workflows", "steps", "executors", "timers"]
        .iter()
        .fold(sql.to_owned(), |sql, table| {
            sql.replace(&format!("keiro_{table} "), &format!("keiro.{table} "))
        })
}

/// A fresh SQLite file migrated to 0007 and seeded; its URL (valid while the
/// returned directory lives).
async fn sqlite_at_0007(now_ms: i64) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("keiro.db").display()
    );
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("open the SQLite file");
    up_to_last_ms_version(&SQLITE_MIGRATOR)
        .run_direct(&mut conn)
        .await
        .expect("migrate SQLite to 0007");
    for statement in seed_statements(now_ms) {
        conn.execute(statement.as_str()).await.expect(&statement);
    }
    conn.close().await.expect("close the SQLite file");
    (url, dir)
}

/// A fresh PostgreSQL database migrated to 0007 (in the `keiro` schema, as
/// the store does) and seeded; its name and URL.
async fn postgres_at_0007(now_ms: i64) -> (String, String) {
    let (name, url) = create_postgres_database().await;
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect to the test database");
    for statement in ["CREATE SCHEMA keiro", "SET search_path TO keiro"] {
        conn.execute(statement).await.expect(statement);
    }
    up_to_last_ms_version(&POSTGRES_MIGRATOR)
        .run_direct(&mut conn)
        .await
        .expect("migrate PostgreSQL to 0007");
    for statement in seed_statements(now_ms) {
        let statement = on_postgres(&statement);
        conn.execute(statement.as_str()).await.expect(&statement);
    }
    conn.close().await.expect("close the setup connection");
    (name, url)
}

/// A step row's `created_at`, which no store operation returns.
async fn step_created_at(store: &Store) -> i64 {
    let sql = "SELECT created_at FROM keiro_steps WHERE workflow_id = 'due'";
    match store {
        Store::Sqlite(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await,
        // One simple-protocol exchange: it also works through a
        // transaction-pooling proxy.
        Store::Postgres(p) => p
            .pool()
            .fetch_one(on_postgres(sql).as_str())
            .await
            .map(|row| sqlx::Row::get(&row, 0)),
    }
    .expect(sql)
}

/// Connects a store to the seeded database at `url` (which migrates it to the
/// latest), checks what every case checks, and closes it.
async fn migrate_and_check(url: &str, now_ms: i64) {
    let store = Store::connect(url, &test_options())
        .await
        .expect("migrate from 0007 to the latest");
    assert_same_instants_in_microseconds(&store, now_ms).await;
    store.close().await;
}

/// What every case checks once the store has migrated the seeded database.
async fn assert_same_instants_in_microseconds(store: &Store, now_ms: i64) {
    let us = |ms: i64| ms * 1000;

    let due = store.get_instance("due").await.unwrap().unwrap();
    assert_eq!(due.wake_at, Some(us(now_ms - 1_000)));
    assert_eq!(due.lease_expires_at, None);
    assert_eq!(
        (due.created_at, due.updated_at),
        (us(now_ms - 60_000), us(now_ms - 30_000))
    );
    assert_eq!(
        due.deadline, None,
        "0010: rows from before have no deadline"
    );
    let running = store.get_instance("running").await.unwrap().unwrap();
    assert_eq!(running.lease_expires_at, Some(us(now_ms + 600_000)));
    assert_eq!(running.wake_at, Some(us(now_ms + 600_000)));
    let never = store.get_instance("never").await.unwrap().unwrap();
    assert_eq!(
        never.wake_at,
        Some(i64::MAX / 1000 * 1000),
        "clamped, not overflowed"
    );
    assert_eq!(step_created_at(store).await, us(now_ms - 50_000));
    let executor = store.get_executor("w").await.unwrap().unwrap();
    assert_eq!(executor.heartbeat_at, us(now_ms - 5_000));

    let timer = store.get_timer("t-due").await.unwrap().unwrap();
    assert_eq!(timer.fire_at, us(now_ms - 1_000));
    assert_eq!(
        (timer.claimed_at, timer.resume_lease_until),
        (None, None),
        "NULL stays NULL"
    );
    assert_eq!(
        (timer.created_at, timer.updated_at),
        (us(now_ms - 60_000), us(now_ms - 30_000))
    );
    let resuming = store.get_timer("t-resuming").await.unwrap().unwrap();
    assert_eq!(
        (resuming.claimed_at, resuming.resume_lease_until),
        (Some(us(now_ms - 90_000)), Some(us(now_ms + 60_000)))
    );

    // Due before the migration, due after it; not due, still not due.
    let due_ids: Vec<String> = store
        .find_due(10)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.id)
        .collect();
    assert_eq!(due_ids, ["due"]);
    assert_eq!(store.count_due_timers(now_us()).await.unwrap(), 1);
    let claimed = store.claim_due_timer(now_us()).await.unwrap().unwrap();
    assert_eq!(claimed.id, "t-due");
    assert_eq!(store.claim_due_timer(now_us()).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_millisecond_rows_become_the_same_instants_in_microseconds() {
    let now_ms = now_us() / 1000;
    let (url, _dir) = sqlite_at_0007(now_ms).await;
    migrate_and_check(&url, now_ms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_millisecond_rows_become_the_same_instants_in_microseconds() {
    let now_ms = now_us() / 1000;
    let (name, url) = postgres_at_0007(now_ms).await;
    migrate_and_check(&url, now_ms).await;
    drop_postgres_database(&name).await;
}

/// The URL of database `name` through this process's pgbouncer (transaction
/// pooling), with no direct URL: migrations run through the proxy.
fn through_pgbouncer(name: &str) -> String {
    PgBouncer::shared(&PostgresServer::from_env(TEST_POSTGRES_URL_VAR)).url(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_millisecond_rows_become_the_same_instants_in_microseconds() {
    let now_ms = now_us() / 1000;
    let (name, _) = postgres_at_0007(now_ms).await;
    migrate_and_check(&through_pgbouncer(&name), now_ms).await;
    drop_postgres_database(&name).await;
}

/// Two processes migrating a fresh database through pgbouncer at once both
/// succeed, each migration is applied once, and sqlx's own migrator on a
/// direct connection then finds the bookkeeping its own (same checksums,
/// nothing to apply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_migrations_race_once_and_agree_with_sqlx() {
    let (name, direct_url) = create_postgres_database().await;
    let url = through_pgbouncer(&name);
    let options = test_options();
    let (a, b) = tokio::join!(
        Store::connect(&url, &options),
        Store::connect(&url, &options)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let Store::Postgres(pg) = &a else {
        panic!("expected the PostgreSQL backend, got {}", a.backend());
    };
    assert!(
        pg.is_pooled(),
        "pooler=transaction was not taken from the URL"
    );

    let mut direct = sqlx::PgConnection::connect(&direct_url).await.unwrap();
    let applied: Vec<(i64, bool, Vec<u8>)> = sqlx::query_as(
        "SELECT version, success, checksum FROM keiro._sqlx_migrations ORDER BY version",
    )
    .fetch_all(&mut direct)
    .await
    .unwrap();
    let embedded: Vec<(i64, bool, Vec<u8>)> = POSTGRES_MIGRATOR
        .iter()
        .map(|m| (m.version, true, m.checksum.to_vec()))
        .collect();
    assert_eq!(applied, embedded);
    direct.execute("SET search_path TO keiro").await.unwrap();
    POSTGRES_MIGRATOR
        .run(&mut direct)
        .await
        .expect("sqlx accepts a database migrated through the proxy");
    direct.close().await.unwrap();

    // A store that must not migrate opens it through the proxy too.
    let checked = Store::connect(
        &url,
        &keiro_store::StoreOptions {
            migrate: false,
            ..test_options()
        },
    )
    .await
    .expect("an up-to-date database opens without migrating");
    for store in [a, b, checked] {
        store.close().await;
    }
    drop_postgres_database(&name).await;
}
