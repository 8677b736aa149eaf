use keiro::workflow;

#[workflow(max_attempts = 3)]
async fn checkout(order_id: u64) -> u64 {
    order_id
}

fn main() {}
