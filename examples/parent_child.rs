//! A parent workflow fans out one child workflow per warehouse and joins them
//! in order. Each child has its own id (`<parent id>/<step>`) and journal; the
//! parent records each child's result as one step.
//!
//! ```text
//! cargo run -p keiro-examples --example parent_child
//! ```

use keiro::{step, workflow};

#[step]
async fn count_stock(warehouse: String, sku: String) -> u32 {
    let n = (warehouse.len() * 7 + sku.len()) as u32;
    println!("  counted {n} x {sku} in {warehouse}");
    n
}

/// A child: counts one warehouse.
#[workflow]
async fn warehouse_stock(warehouse: String, sku: String) -> u32 {
    count_stock(warehouse, sku).await
}

/// The parent: one child per warehouse, joined in order.
#[workflow]
async fn total_stock(sku: String, warehouses: Vec<String>) -> u32 {
    let mut children = Vec::new();
    for warehouse in warehouses {
        let child = keiro::spawn(warehouse_stock(warehouse, sku.clone())).await;
        children.push(child.expect("start a child"));
    }
    let mut total = 0;
    for child in children {
        println!("  joining child {}", child.id());
        total += child.await.unwrap_or(0);
    }
    total
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let id = format!("stock-{}", keiro::Uuid::new_v4().simple());
    let warehouses = ["osaka", "lyon", "porto"].map(String::from).to_vec();
    println!("{id}:");
    let total = total_stock("kettle".into(), warehouses).id(&id).await?;
    println!("total: {total}");
    let again = total_stock("kettle".into(), vec![]).id(&id).await?;
    println!("asked again under the same id: {again} (replayed, no child ran)");
    Ok(())
}
