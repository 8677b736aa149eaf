use keiro::{step, Transaction};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    cents: i64,
}

#[step(transaction)]
async fn debit(tx: &mut Transaction<'_>, order: Order) -> Result<i64, String> {
    let _ = tx.backend();
    Ok(order.cents)
}

fn main() {}
