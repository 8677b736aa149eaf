//! The quickstart: a three-step checkout workflow journaled in SQLite.
//!
//! ```text
//! cargo run -p keiro-examples --example quickstart            # runs the steps
//! cargo run -p keiro-examples --example quickstart            # same id: replays the result
//! cargo run -p keiro-examples --example quickstart -- order-7 # another id: runs again
//! ```
//!
//! With no `KEIRO_DATABASE_URL` it journals into `keiro.db` in the working
//! directory (created if missing).

use std::sync::atomic::{AtomicUsize, Ordering};

use keiro::{step, workflow};
use serde::{Deserialize, Serialize};

/// How many step bodies ran in this process.
static STEPS_RUN: AtomicUsize = AtomicUsize::new(0);

fn running(step: &str) {
    STEPS_RUN.fetch_add(1, Ordering::SeqCst);
    println!("  ran step `{step}`");
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    sku: String,
    qty: u32,
    email: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    hold: String,
    payment: String,
    placed_at_unix: u64,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum ShopError {
    #[error("{0} is out of stock")]
    OutOfStock(String),
    #[error("the card was declined")]
    Declined,
}

#[step]
async fn reserve(sku: String, qty: u32) -> Result<String, ShopError> {
    running("reserve");
    if qty == 0 {
        return Err(ShopError::OutOfStock(sku));
    }
    Ok(format!("hold-{sku}-{qty}"))
}

#[step(max_attempts = 3, backoff_ms = 100)]
async fn charge(amount_cents: u64) -> Result<String, ShopError> {
    running("charge");
    if amount_cents > 1_000_000 {
        return Err(ShopError::Declined);
    }
    Ok(format!("payment-{amount_cents}"))
}

#[step]
async fn email(to: String, body: String) -> Result<(), ShopError> {
    running("email");
    println!("    (to {to}: {body})");
    Ok(())
}

#[workflow]
async fn checkout(order: Order) -> Result<Receipt, ShopError> {
    let hold = reserve(order.sku.clone(), order.qty).await?;
    let payment = charge(u64::from(order.qty) * 499).await?;
    let placed_at = keiro::now().await;
    email(order.email.clone(), format!("{hold} paid by {payment}")).await?;
    Ok(Receipt {
        hold,
        payment,
        placed_at_unix: placed_at
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    })
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let id = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "order-42".to_owned());
    let order = Order {
        sku: "apple".into(),
        qty: 3,
        email: "ada@example.com".into(),
    };
    println!("checkout {id}:");
    let receipt = checkout(order).id(&id).await?;
    match STEPS_RUN.load(Ordering::SeqCst) {
        0 => {
            println!("  no step ran: `{id}` had finished before, its result came from the journal")
        }
        n => println!("  {n} steps ran and were journaled"),
    }
    println!("result: {receipt:?}");
    Ok(())
}
