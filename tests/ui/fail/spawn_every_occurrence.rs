use keiro::workflow;

// Every spawn is reported, not just the first.
#[workflow]
async fn fan_out(n: u64) -> u64 {
    tokio::spawn(async {});
    std::thread::spawn(|| {});
    tokio::task::spawn_blocking(move || n).await.unwrap_or(0)
}

fn main() {}
