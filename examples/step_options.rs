//! Step timeouts and `retry_if`: a flaky inventory call whose first attempt
//! hangs is cut off after 200 ms and retried; a card decline is final at
//! once, while an unavailable gateway is retried.
//!
//! ```text
//! cargo run -p keiro-examples --example step_options
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use keiro::{step, workflow, Keiro, StepTimeout};
use serde::{Deserialize, Serialize};

static INVENTORY_CALLS: AtomicU32 = AtomicU32::new(0);
static CHARGE_CALLS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, Clone, Serialize, Deserialize)]
enum ShopError {
    TimedOut(String),
    Declined,
    GatewayDown,
}

impl From<StepTimeout> for ShopError {
    fn from(t: StepTimeout) -> Self {
        ShopError::TimedOut(t.to_string())
    }
}

/// Only a gateway outage is worth retrying.
fn retryable(error: &ShopError) -> bool {
    matches!(error, ShopError::GatewayDown | ShopError::TimedOut(_))
}

/// Hangs on its first attempt; answers at once afterwards.
#[step(timeout_ms = 200, max_attempts = 3, backoff_ms = 50)]
async fn reserve(sku: String) -> Result<u32, ShopError> {
    let attempt = INVENTORY_CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    println!("  reserve {sku}: attempt {attempt}");
    if attempt == 1 {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    Ok(7)
}

/// Declines the card: final at once, whatever `max_attempts` says.
#[step(max_attempts = 5, backoff_ms = 50, retry_if = retryable)]
async fn charge(cents: u64) -> Result<String, ShopError> {
    let attempt = CHARGE_CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    println!("  charge {cents}: attempt {attempt}");
    Err(ShopError::Declined)
}

#[workflow]
async fn checkout(sku: String, cents: u64) -> Result<String, ShopError> {
    let held = reserve(sku).await?;
    let receipt = charge(cents).await?;
    Ok(format!("{held} held, {receipt}"))
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let url = std::env::var(keiro::DATABASE_URL_ENV).unwrap_or_else(|_| "sqlite:keiro.db".into());
    let keiro = Keiro::connect(&url).await?;
    let id = format!("checkout-{}", keiro::Uuid::new_v4().simple());
    let out = checkout("sku-1".into(), 1999).id(&id).on(&keiro).await?;
    println!("{id}: {out:?}");
    println!(
        "reserve ran {} times (the first cut off), charge {} time (declined is final)",
        INVENTORY_CALLS.load(Ordering::SeqCst),
        CHARGE_CALLS.load(Ordering::SeqCst)
    );
    Ok(())
}
