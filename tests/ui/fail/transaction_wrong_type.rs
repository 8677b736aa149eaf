use keiro::step;

struct Transaction<'a>(&'a str);

#[step(transaction)]
async fn debit(tx: &mut Transaction<'_>, cents: i64) -> Result<i64, String> {
    let _ = tx.0;
    Ok(cents)
}

fn main() {}
