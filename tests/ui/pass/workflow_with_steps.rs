use keiro::{step, workflow};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    pub sku: String,
    pub qty: u32,
    pub email: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Receipt {
    pub hold: String,
    pub label: String,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
pub enum ShopError {
    #[error("out of stock: {0}")]
    OutOfStock(String),
}

#[step]
async fn reserve(sku: String, qty: u32) -> Result<String, ShopError> {
    if qty == 0 {
        return Err(ShopError::OutOfStock(sku));
    }
    Ok(format!("hold-{sku}-{qty}"))
}

#[step]
async fn label(order: Order) -> String {
    format!("label for {}", order.email)
}

#[step]
async fn audit(mut lines: Vec<String>) {
    lines.push("audited".to_owned());
}

/// Reserves stock and prints a label.
#[workflow]
pub async fn checkout(order: Order) -> Result<Receipt, ShopError> {
    let hold = reserve(order.sku.clone(), order.qty).await?;
    let label = label(order.clone()).await;
    audit(vec![hold.clone()]).await;
    Ok(Receipt { hold, label })
}

#[tokio::main]
pub(crate) async fn main() {
    let order = Order {
        sku: "apple".to_owned(),
        qty: 2,
        email: "a@example.com".to_owned(),
    };
    // Outside a workflow a step is a plain call.
    assert_eq!(
        reserve("apple".to_owned(), 2).await.unwrap(),
        "hold-apple-2"
    );
    assert!(reserve("pear".to_owned(), 0).await.is_err());
    assert_eq!(label(order.clone()).await, "label for a@example.com");
    audit(Vec::new()).await;

    let _call: keiro::WorkflowCall<Result<Receipt, ShopError>> = checkout(order);
}
