//! Transactional steps behind pgbouncer in transaction pooling mode: a
//! body's own prepared statements. (Apart from `pooler.rs`, whose worker
//! processes must link the same workflows as the test binary: a workflow
//! declared in a test binary alone changes its default app version.)

use keiro_tests::{Backend, TestDb};
use sqlx::Connection;

/// A transactional step whose body runs its statements as sqlx's default
/// (named) prepared statements, as the README's example does.
#[keiro::step(transaction)]
async fn enter_prepared(tx: &mut keiro::Transaction<'_>, entry: String) -> Result<(), String> {
    let mut db = tx.postgres().expect("PostgreSQL");
    sqlx::query("INSERT INTO pooled_ledger (entry) VALUES ($1)")
        .bind(&entry)
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM pooled_ledger WHERE entry = $1")
        .bind(&entry)
        .fetch_one(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(rows, 1);
    Ok(())
}

#[keiro::workflow]
async fn enter_ten(run: u32) -> Result<(), String> {
    for n in 0..10 {
        enter_prepared(format!("{run}-{n}")).await?;
    }
    Ok(())
}

/// Behind pgbouncer (1.18 here, which does not track prepared statements),
/// a body's named prepared statements, left on the server connection by one
/// client connection's transaction, never collide with the next client's
/// in a later transactional step there (`42P05 prepared statement
/// "sqlx_s_1" already exists`, which would be journaled as the step's
/// `Err`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_bodies_with_prepared_statements_run_behind_pgbouncer() {
    let db = TestDb::new(Backend::PgBouncer).await;
    let keiro = db.keiro().await;
    let mut direct = sqlx::PgConnection::connect(&db.direct_url).await.unwrap();
    sqlx::query("CREATE TABLE pooled_ledger (entry TEXT PRIMARY KEY)")
        .execute(&mut direct)
        .await
        .unwrap();
    let mut runs = Vec::new();
    for run in 0..8u32 {
        let call = enter_ten(run).on(&keiro);
        runs.push(tokio::spawn(async move { call.await }));
    }
    for run in runs {
        let out = run.await.unwrap().unwrap();
        assert_eq!(out, Ok(()));
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pooled_ledger")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(rows, 80);
}
