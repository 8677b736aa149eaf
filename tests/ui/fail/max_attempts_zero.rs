use keiro::step;

#[step(max_attempts = 0)]
async fn reserve(sku: String) -> Result<String, String> {
    Ok(sku)
}

fn main() {}
