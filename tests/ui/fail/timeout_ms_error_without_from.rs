use keiro::step;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum FetchError {
    Http(u16),
}

#[step(timeout_ms = 2000)]
async fn fetch(url: String) -> Result<String, FetchError> {
    Ok(url)
}

fn main() {}
