use keiro::workflow;

struct Receipt {
    total: u64,
}

#[workflow]
async fn checkout(total: u64) -> Receipt {
    Receipt { total }
}

fn main() {}
