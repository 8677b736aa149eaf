use keiro::step;

#[step]
async fn reserve<'a>(sku: String) -> String {
    sku
}

fn main() {}
