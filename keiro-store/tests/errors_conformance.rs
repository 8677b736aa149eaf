//! How store errors are classified, on both backends: what a retry can get
//! past (a dropped connection, a lock held elsewhere) is transient; what it
//! cannot (a constraint violation, a statement the database refuses) is
//! reported at once as a non-transient error naming the operation.

#[macro_use]
mod support;

use std::time::{Duration, Instant};

use keiro_store::{Lease, NewInstance, NewTimer, StepRow, Store, StoreError, StoreOptions};
use sqlx::{Connection, Executor};
use support::{Backend, TestDb};

conformance!(
    a_constraint_violation_is_reported_not_retried,
    a_payload_the_column_refuses_is_reported_not_retried,
    an_undefined_table_is_reported_not_retried,
    a_dropped_connection_or_a_held_lock_is_transient,
    a_read_only_database_refuses_the_write_and_keeps_nothing,
    an_id_the_store_refuses_is_invalid_not_retried,
);

/// PostgreSQL's own refusals of a value: a NUL byte in text (SQLSTATE 22021)
/// and an index row over the btree limit (54000). Ids are checked before they
/// reach the database; reads and step rows are not, and reach it as given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusals_of_a_value_are_reported_not_retried() {
    let db = TestDb::postgres().await;
    let error = db.store.get_instance("nul\0byte").await.unwrap_err();
    assert_reported(&error, "get_instance");
    assert_sqlstate(&error, "22021");

    // Random text does not compress below the index's limit.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let huge: String = (0..10_000)
        .map(|_| {
            // xorshift64: text with no repeats for the index to compress.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(
                b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
                    [(state % 64) as usize],
            )
        })
        .collect();
    let error = db
        .store
        .append_steps(&[step(&huge, 0, "1")])
        .await
        .unwrap_err();
    assert_reported(&error, "append_steps");
    assert_sqlstate(&error, "54000");
    db.finish().await;
}

/// Asserts that `error` is PostgreSQL's SQLSTATE `code`.
fn assert_sqlstate(error: &StoreError, code: &str) {
    let StoreError::Query { source, .. } = error else {
        panic!("expected a query error, got {error:?}");
    };
    let found = source.as_database_error().and_then(|db| db.code());
    assert_eq!(found.as_deref(), Some(code), "{error:?}");
}

fn step(id: &str, seq: i64, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.to_owned(),
        generation: 0,
        seq,
        name: format!("step_{seq}"),
        kind: "step".to_owned(),
        result: result.to_owned(),
    }
}

fn new_instance(id: &str) -> NewInstance<'_> {
    NewInstance::new(id, "checkout", "{}")
}

/// Asserts `error` is a non-transient [`StoreError::Query`] of operation `op`.
fn assert_reported(error: &StoreError, op: &str) {
    assert!(
        matches!(error, StoreError::Query { op: found, .. } if *found == op),
        "expected a `{op}` query error, got {error:?}"
    );
    assert!(!error.is_transient(), "must not be retried: {error}");
    assert!(error.to_string().contains(op), "{error}");
}

/// Runs one statement on the test's database, outside the store, with
/// SQLite's table names (`keiro_x` becomes `keiro.x` on PostgreSQL).
async fn raw(db: &TestDb, sql: &str) {
    match db.backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            conn.execute(sql).await.expect(sql);
        }
        Backend::Postgres => {
            let sql = sql.replace("keiro_", "keiro.");
            let mut conn = sqlx::PgConnection::connect(db.direct_url()).await.unwrap();
            conn.execute(sql.as_str()).await.expect(&sql);
        }
    }
}

async fn a_constraint_violation_is_reported_not_retried(db: &TestDb) {
    // A unique index the journal's `ON CONFLICT` does not cover.
    raw(db, "CREATE UNIQUE INDEX one_result ON keiro_steps (result)").await;
    db.store.create_instance(&new_instance("wf")).await.unwrap();
    let started = Instant::now();
    let error = db
        .store
        .append_steps(&[step("wf", 0, "\"same\""), step("wf", 1, "\"same\"")])
        .await
        .unwrap_err();
    assert_reported(&error, "append_steps");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Nothing of the refused batch was recorded.
    assert!(db.store.load_journal("wf", 0).await.unwrap().is_empty());
}

async fn a_payload_the_column_refuses_is_reported_not_retried(db: &TestDb) {
    // SQLite: the CHECK (json_valid) constraint; PostgreSQL: the json type.
    let error = db
        .store
        .schedule_timer(&NewTimer {
            id: "t1",
            process_manager: "pm",
            correlation_id: "c",
            fire_at: 0,
            payload: "{not json",
        })
        .await
        .unwrap_err();
    assert_reported(&error, "schedule_timer");
    assert_eq!(db.store.get_timer("t1").await.unwrap(), None);
}

async fn an_undefined_table_is_reported_not_retried(db: &TestDb) {
    // What a syntax error is too: SQLITE_ERROR, SQLSTATE class 42.
    raw(db, "ALTER TABLE keiro_executors RENAME TO gone_executors").await;
    let error = db.store.get_executor("e1").await.unwrap_err();
    assert_reported(&error, "get_executor");
}

async fn a_dropped_connection_or_a_held_lock_is_transient(db: &TestDb) {
    db.store.create_instance(&new_instance("wf")).await.unwrap();
    let lease = Lease {
        owner: "worker-1",
        ttl_us: 60_000_000,
    };
    let error = match db.backend {
        Backend::Sqlite => claim_under_a_held_write_lock(db, lease).await,
        Backend::Postgres => claim_on_a_terminated_connection(db, lease).await,
    };
    assert!(
        matches!(&error, StoreError::Query { op: "claim", .. }),
        "expected a `claim` query error, got {error:?}"
    );
    assert!(error.is_transient(), "must be retried: {error:?}");
    // The retry succeeds once the fault is gone.
    let claimed = db.store.claim("wf", lease).await.unwrap();
    assert_eq!(claimed.map(|row| row.id).as_deref(), Some("wf"));
}

async fn a_read_only_database_refuses_the_write_and_keeps_nothing(db: &TestDb) {
    // A store of its own, whose one connection is made read-only: SQLite's
    // `query_only` (SQLITE_READONLY), PostgreSQL's read-only transactions
    // (SQLSTATE 25006). On SQLite that is the file's setting and is
    // reported, not retried; on PostgreSQL it is how a primary demoted in a
    // switchover answers until its sessions end, so it is retried (the
    // retry reaches the new primary).
    if db.via_pooler() {
        // A session setting does not outlive a transaction behind a
        // transaction-pooling proxy: the direct variants cover this path.
        return;
    }
    let options = StoreOptions {
        max_connections: Some(1),
        ..StoreOptions::default()
    };
    let store = Store::connect(&db.url, &options).await.unwrap();
    match &store {
        Store::Sqlite(s) => {
            sqlx::query("PRAGMA query_only = 1")
                .execute(s.pool())
                .await
                .unwrap();
        }
        Store::Postgres(p) => {
            sqlx::query("SET default_transaction_read_only = on")
                .execute(p.pool())
                .await
                .unwrap();
        }
    }
    let error = store
        .create_instance(&new_instance("wf"))
        .await
        .unwrap_err();
    let StoreError::Query { op, source } = &error else {
        panic!("expected a `create_instance` query error, got {error:?}");
    };
    assert_eq!(*op, "create_instance", "{error:?}");
    assert!(error.to_string().contains("create_instance"), "{error}");
    assert_eq!(
        error.is_transient(),
        db.backend == Backend::Postgres,
        "{error}"
    );
    let code = source.as_database_error().and_then(|e| e.code());
    let expected = match db.backend {
        Backend::Sqlite => "8",
        Backend::Postgres => "25006",
    };
    assert_eq!(code.as_deref(), Some(expected), "{error:?}");
    store.close().await;
    assert_eq!(db.store.get_instance("wf").await.unwrap(), None);
}

async fn an_id_the_store_refuses_is_invalid_not_retried(db: &TestDb) {
    let long = "k".repeat(keiro_store::MAX_ID_BYTES + 1);
    for (id, why) in [
        ("nul\0id", "NUL byte at byte 3"),
        ("", "empty"),
        (&long, "1025 bytes"),
    ] {
        let error = db
            .store
            .create_instance(&new_instance(id))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StoreError::InvalidId { what: "workflow id", reason, .. } if reason.contains(why)),
            "{error:?}"
        );
        assert!(!error.is_transient(), "{error}");
        let error = db
            .store
            .schedule_timer(&NewTimer {
                id,
                process_manager: "pm",
                correlation_id: "c",
                fire_at: 0,
                payload: "{}",
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                &error,
                StoreError::InvalidId {
                    what: "timer id",
                    ..
                }
            ),
            "{error:?}"
        );
    }
}

/// SQLite: another connection holds the write lock past the busy timeout, so
/// the claim fails with SQLITE_BUSY. The claim runs on a store of its own
/// whose one connection waits only briefly.
async fn claim_under_a_held_write_lock(db: &TestDb, lease: Lease<'_>) -> StoreError {
    let options = StoreOptions {
        max_connections: Some(1),
        ..StoreOptions::default()
    };
    let store = Store::connect(&db.url, &options).await.unwrap();
    let Store::Sqlite(sqlite) = &store else {
        unreachable!("a sqlite: URL opens a SQLite store");
    };
    sqlx::query("PRAGMA busy_timeout = 50")
        .execute(sqlite.pool())
        .await
        .unwrap();
    let mut holder = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let error = store.claim("wf", lease).await.unwrap_err();
    holder.execute("ROLLBACK").await.unwrap();
    store.close().await;
    error
}

/// PostgreSQL: the claim waits on a row lock another session holds, and its
/// connection is terminated (`pg_terminate_backend`) while it waits.
async fn claim_on_a_terminated_connection(db: &TestDb, lease: Lease<'_>) -> StoreError {
    let mut holder = sqlx::PgConnection::connect(db.direct_url()).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("SELECT 1 FROM keiro.workflows WHERE id = 'wf' FOR UPDATE")
        .await
        .unwrap();
    let (store, ttl_us) = (db.store.clone(), lease.ttl_us);
    let owner = lease.owner.to_owned();
    let claim = tokio::spawn(async move {
        let lease = Lease {
            owner: &owner,
            ttl_us,
        };
        store.claim("wf", lease).await
    });
    // Wait until the claim blocks on the lock, then drop its connection.
    // (From a session outside any transaction: one inside would see a
    // snapshot of `pg_stat_activity` taken at its first read.)
    let mut admin = sqlx::PgConnection::connect(db.direct_url()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let terminated: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND wait_event_type = 'Lock') t",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if terminated > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the claim never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let error = claim.await.unwrap().unwrap_err();
    holder.execute("ROLLBACK").await.unwrap();
    error
}
