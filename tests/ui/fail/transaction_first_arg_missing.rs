use keiro::step;

#[step(transaction)]
async fn debit(account: i64, cents: i64) -> Result<i64, String> {
    Ok(account - cents)
}

fn main() {}
