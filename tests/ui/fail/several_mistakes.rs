use keiro::step;

struct Shop;

impl Shop {
    #[step(max_attempts = 0, retry = true)]
    fn reserve<T>(&self, sku: &str, extra: T) -> String {
        drop(extra);
        sku.to_owned()
    }
}

fn main() {}
