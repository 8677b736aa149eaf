//! A small database to practise the `keiro` command on: three checkouts, one
//! completed, one failed (its card declined after three attempts) and one
//! suspended waiting for the warehouse's answer (an awakeable).
//!
//! ```text
//! cargo run -p keiro-examples --example operate          # writes operate.db afresh
//! cargo run -p keiro-cli -- --database sqlite:operate.db list
//! cargo run -p keiro-cli -- --database sqlite:operate.db show order-1002
//! ```

use std::time::Duration;

use keiro::{step, workflow, Keiro, WorkflowStatus};

/// The demo's database file.
const DB_FILE: &str = "operate.db";

#[step]
async fn reserve(order: u32) -> Result<String, String> {
    Ok(format!("hold-{order}"))
}

#[step(max_attempts = 3, backoff_ms = 5)]
async fn charge(order: u32) -> Result<String, String> {
    if order == 1002 {
        return Err("card declined".to_owned());
    }
    Ok(format!("payment-{order}"))
}

#[workflow]
async fn checkout(order: u32) -> Result<String, String> {
    let hold = reserve(order).await?;
    let payment = charge(order).await?;
    if order == 1003 {
        let shipped = keiro::awakeable::<String>().await;
        let parcel = shipped.await.map_err(|e| e.to_string())?;
        return Ok(format!("{hold} {payment} {parcel}"));
    }
    Ok(format!("{hold} {payment}"))
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    for file in [DB_FILE, "operate.db-wal", "operate.db-shm"] {
        let _ = std::fs::remove_file(file);
    }
    let keiro = Keiro::builder(format!("sqlite:{DB_FILE}"))
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await?;
    for order in 1001..=1003 {
        let id = format!("order-{order}");
        let handle = checkout(order).id(&id).on(&keiro).start().await?;
        loop {
            let status = handle.status().await?;
            if !matches!(status, WorkflowStatus::Pending | WorkflowStatus::Running) {
                println!("{id}: {status:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("now try: cargo run -p keiro-cli -- --database sqlite:{DB_FILE} list");
    Ok(())
}
