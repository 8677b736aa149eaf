use keiro::step;

fn retryable(code: &u16) -> bool {
    *code >= 500
}

#[step(max_attempts = 3, retry_if = retryable)]
async fn fetch(url: String) -> Result<String, String> {
    Ok(url)
}

fn main() {}
