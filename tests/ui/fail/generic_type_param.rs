use keiro::workflow;

#[workflow]
async fn checkout<T>(order: T) -> u64 {
    drop(order);
    0
}

fn main() {}
