use keiro::step;

#[step(timeout_ms = 2000)]
async fn fetch(url: String) -> String {
    url
}

#[step(timeout_ms = 500)]
async fn ping() {}

fn main() {}
