use keiro::step;

#[step(max_attempts = 3, retry_if = |e: &String| e.is_empty())]
async fn fetch(url: String) -> Result<String, String> {
    Ok(url)
}

#[step(max_attempts = 3, retry_if = "retryable")]
async fn fetch_again(url: String) -> Result<String, String> {
    Ok(url)
}

fn main() {}
