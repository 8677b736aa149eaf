use keiro::step;

#[step(max_attempts = 3, max_attempts = 5)]
async fn reserve(sku: String) -> Result<String, String> {
    Ok(sku)
}

fn main() {}
