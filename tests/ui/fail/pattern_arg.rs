use keiro::workflow;

#[workflow]
async fn checkout((sku, qty): (String, u32)) -> String {
    format!("{sku} x{qty}")
}

fn main() {}
