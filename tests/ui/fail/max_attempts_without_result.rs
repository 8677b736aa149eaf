use keiro::step;

#[step(max_attempts = 3)]
async fn reserve(sku: String) -> String {
    sku
}

fn main() {}
