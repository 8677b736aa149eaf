use keiro::workflow;

struct Order {
    sku: String,
}

#[workflow]
async fn checkout(order: Order) -> String {
    order.sku
}

fn main() {}
