use keiro::workflow;

#[workflow]
async fn checkout(sku: impl Into<String>) -> String {
    sku.into()
}

fn main() {}
