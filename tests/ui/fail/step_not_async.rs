use keiro::step;

#[step]
fn reserve(sku: String) -> String {
    sku
}

fn main() {}
