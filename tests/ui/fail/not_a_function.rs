use keiro::workflow;

#[workflow]
struct Checkout {
    order_id: u64,
}

fn main() {}
