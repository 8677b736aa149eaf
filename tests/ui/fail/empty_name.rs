use keiro::workflow;

#[workflow(name = "")]
async fn checkout(order_id: u64) -> u64 {
    order_id
}

fn main() {}
