use keiro::workflow;

#[workflow(transaction)]
async fn pay(cents: i64) -> Result<i64, String> {
    Ok(cents)
}

fn main() {}
