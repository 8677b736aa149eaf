use keiro::step;

#[step]
async fn reserve(sku: &str) -> String {
    sku.to_owned()
}

fn main() {}
