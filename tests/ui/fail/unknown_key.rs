use keiro::step;

#[step(retries = 3)]
async fn reserve(sku: String) -> Result<String, String> {
    Ok(sku)
}

fn main() {}
