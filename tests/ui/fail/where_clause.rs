use keiro::step;

#[step]
async fn reserve(sku: String) -> String
where
    String: Clone,
{
    sku
}

fn main() {}
