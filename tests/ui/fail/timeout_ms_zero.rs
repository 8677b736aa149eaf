use keiro::step;

#[step(timeout_ms = 0)]
async fn fetch(url: String) -> Result<String, String> {
    Ok(url)
}

fn main() {}
