use keiro::step;

fn retryable(_: &String) -> bool {
    true
}

#[step(retry_if = retryable)]
async fn fetch(url: String) -> Result<String, String> {
    Ok(url)
}

fn main() {}
