// The transaction is a `#[step(transaction)]`'s first argument, taken once,
// by `&mut`, under a plain name.
use keiro::{step, Transaction};

#[step(transaction)]
async fn second(cents: i64, tx: &mut Transaction<'_>) -> Result<i64, String> {
    let _ = tx;
    Ok(cents)
}

#[step(transaction)]
async fn twice(tx: &mut Transaction<'_>, again: &mut Transaction<'_>) -> Result<i64, String> {
    let _ = (tx, again);
    Ok(1)
}

#[step]
async fn unflagged(cents: i64, tx: &mut Transaction<'_>) -> Result<i64, String> {
    let _ = tx;
    Ok(cents)
}

#[step(transaction)]
async fn by_value(tx: Transaction<'static>, cents: i64) -> Result<i64, String> {
    let _ = tx;
    Ok(cents)
}

#[step(transaction)]
async fn in_a_pattern(ref tx: &mut Transaction<'_>, cents: i64) -> Result<i64, String> {
    let _ = tx;
    Ok(cents)
}

fn main() {}
