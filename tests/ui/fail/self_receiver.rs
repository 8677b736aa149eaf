use keiro::step;

struct Shop;

impl Shop {
    #[step]
    async fn reserve(&self, sku: String) -> String {
        sku
    }
}

fn main() {}
