//! A durable race: a quote from a slow supplier against a deadline, and a
//! payment that waits for a "confirm" message at most a few seconds. The
//! winner of each `keiro::select!` is journaled, so asking again under the
//! same id replays the same branches, whatever would win now.
//!
//! ```text
//! cargo run -p keiro-examples --example select
//! ```

use std::time::Duration;

use keiro::{step, workflow};

#[step]
async fn supplier_quote(sku: String) -> u32 {
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("  the supplier quoted {sku}");
    120
}

#[workflow]
async fn buy(sku: String) -> Result<String, String> {
    let price = keiro::select! {
        price = supplier_quote(sku.clone()) => price,
        _ = keiro::sleep(Duration::from_millis(100)) => {
            println!("  no quote within 100 ms: list price");
            150
        }
    };
    let confirmed = keiro::select! {
        m = keiro::recv::<bool>("confirm") => m.map_err(|e| e.to_string())?,
        _ = keiro::sleep(Duration::from_secs(2)) => false,
    };
    Ok(format!("{sku} at {price}, confirmed: {confirmed}"))
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let id = format!("buy-{}", keiro::Uuid::new_v4().simple());
    println!("{id}:");
    let handle = buy("kettle".into()).id(&id).start().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    keiro::send(&id, "confirm", &true).await?;
    println!("{:?}", handle.result().await?);
    let again = buy("kettle".into()).id(&id).await?;
    println!("asked again under the same id: {again:?} (replayed)");
    Ok(())
}
