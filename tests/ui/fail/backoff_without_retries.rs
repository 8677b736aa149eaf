use keiro::step;

#[step(backoff_ms = 200)]
async fn reserve(sku: String) -> Result<String, String> {
    Ok(sku)
}

fn main() {}
