use keiro::step;

struct Sku(String);

#[step(max_attempts = 3)]
async fn reserve(sku: Sku) -> Result<String, String> {
    Ok(sku.0)
}

fn main() {}
