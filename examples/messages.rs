//! Talking to a running workflow: an order workflow publishes its progress
//! (an event) and a log (a stream), then waits for a payment message, giving
//! up after a deadline. `main` plays the outside world: it reads the progress
//! and the log while the workflow runs and sends the payment.
//!
//! ```text
//! cargo run -p keiro-examples --example messages
//! ```

use std::time::Duration;

use futures::StreamExt;
use keiro::{step, workflow, Keiro};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    cents: u64,
    reference: String,
}

#[step]
async fn reserve_stock(order: String) -> String {
    format!("stock held for {order}")
}

#[step]
async fn ship(order: String, reference: String) -> String {
    format!("{order} shipped (payment {reference})")
}

#[workflow]
async fn order(order: String) -> Result<String, String> {
    let fail = |e: keiro::Error| e.to_string();
    keiro::set_event("stage", "reserving").await.map_err(fail)?;
    let held = reserve_stock(order.clone()).await;
    keiro::write_stream("log", &held).await.map_err(fail)?;
    keiro::set_event("stage", "awaiting payment")
        .await
        .map_err(fail)?;
    // Waits for the message, durably: the deadline survives crashes.
    let payment = keiro::recv::<Payment>("payment")
        .timeout(Duration::from_secs(3600))
        .await
        .map_err(fail)?;
    let Some(payment) = payment else {
        keiro::set_event("stage", "expired").await.map_err(fail)?;
        return Err("no payment within an hour".into());
    };
    keiro::write_stream("log", &format!("paid {} cents", payment.cents))
        .await
        .map_err(fail)?;
    let shipped = ship(order, payment.reference).await;
    keiro::write_stream("log", &shipped).await.map_err(fail)?;
    keiro::set_event("stage", "shipped").await.map_err(fail)?;
    Ok(shipped)
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let url = std::env::var(keiro::DATABASE_URL_ENV).unwrap_or_else(|_| "sqlite:keiro.db".into());
    let keiro = Keiro::connect(&url).await?;
    let id = format!("order-{}", keiro::Uuid::new_v4().simple());
    let handle = order(id.clone()).id(&id).on(&keiro).start().await?;

    // Read the progress from outside while the workflow runs.
    let stage: Option<String> = keiro
        .get_event(&id, "stage")
        .wait(Duration::from_secs(5))
        .await?;
    println!("{id}: stage {stage:?}");
    while keiro.get_event::<String>(&id, "stage").await?.as_deref() != Some("awaiting payment") {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("{id}: awaiting payment; sending it");
    let payment = Payment {
        cents: 4200,
        reference: "pay-7".into(),
    };
    // Retried sends with the same key are no-ops.
    keiro
        .send(&id, "payment", &payment)
        .idempotency_key("pay-7")
        .await?;

    // The log, in order, ending when the workflow ends.
    let mut log = keiro.read_stream::<String>(&id, "log");
    while let Some(line) = log.next().await {
        println!("  log: {}", line?);
    }
    let result = handle.result().await?;
    let stage: Option<String> = keiro.get_event(&id, "stage").await?;
    println!("{id} finished: {result:?} (stage {stage:?})");
    Ok(())
}
