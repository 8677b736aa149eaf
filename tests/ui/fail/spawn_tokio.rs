use keiro::{step, workflow};

#[step]
async fn charge(cents: u64) -> u64 {
    cents
}

#[workflow]
async fn checkout(cents: u64) -> u64 {
    let task = tokio::spawn(async move { charge(cents).await });
    task.await.unwrap_or(0)
}

fn main() {}
