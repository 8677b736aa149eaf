//! The outbox: an application's own write and a workflow start commit in one
//! transaction on keiro's database, so there is never an order without its
//! shipment workflow, nor a shipment for an order that was rolled back.
//!
//! ```text
//! cargo run -p keiro-examples --example outbox
//! ```
//!
//! With no `KEIRO_DATABASE_URL` it uses `keiro.db` in the working directory
//! (created if missing); a `postgres://` URL works the same.

use keiro::{workflow, Keiro};

#[workflow]
async fn ship(order: String) -> String {
    format!("{order} shipped")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keiro = keiro::global().await?;
    let worker = keiro.resume_worker(Default::default()).await?;
    let order = format!("order-{}", keiro::Uuid::new_v4().simple());
    let handle = place(&keiro, &order).await?;
    println!("{}", handle.result().await?);
    worker.shutdown().await;
    Ok(())
}

/// Records the order and enqueues its shipment in one transaction.
async fn place(
    keiro: &Keiro,
    order: &str,
) -> Result<keiro::WorkflowHandle<String>, Box<dyn std::error::Error>> {
    const TABLE: &str = "CREATE TABLE IF NOT EXISTS app_orders (id TEXT PRIMARY KEY)";
    const INSERT: &str = "INSERT INTO app_orders (id) VALUES ($1)";
    let store = keiro.store();
    let call = ship(order.to_owned()).id(format!("ship-{order}")).on(keiro);
    if let Some(pool) = store.sqlite_pool() {
        // SQLite: take the write lock from the first statement.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(TABLE).execute(&mut *tx).await?;
        sqlx::query(INSERT).bind(order).execute(&mut *tx).await?;
        let handle = call.enqueue_tx(&mut tx).await?;
        tx.commit().await?;
        return Ok(handle);
    }
    let pool = store
        .postgres_pool()
        .ok_or("keiro runs on SQLite or PostgreSQL")?;
    let mut tx = pool.begin().await?;
    sqlx::query(TABLE).execute(&mut *tx).await?;
    sqlx::query(INSERT).bind(order).execute(&mut *tx).await?;
    let handle = call.enqueue_tx(&mut tx).await?;
    tx.commit().await?; // the order row and the workflow, together
    Ok(handle)
}
