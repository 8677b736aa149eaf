use keiro::{step, Transaction};

#[step(transaction)]
async fn debit(tx: &Transaction<'_>, cents: i64) -> Result<i64, String> {
    let _ = tx.backend();
    Ok(cents)
}

fn main() {}
