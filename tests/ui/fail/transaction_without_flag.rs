use keiro::{step, Transaction};

#[step]
async fn debit(tx: &mut Transaction<'_>, cents: i64) -> Result<i64, String> {
    let _ = tx.backend();
    Ok(cents)
}

fn main() {}
