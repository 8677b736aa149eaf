use keiro::step;

#[step(max_attempts = "x")]
async fn reserve(sku: String) -> Result<String, String> {
    Ok(sku)
}

fn main() {}
