use keiro::{step, workflow};

#[step]
async fn charge(cents: u64) -> u64 {
    cents
}

#[workflow]
async fn batch(amounts: Vec<u64>) -> u64 {
    let mut set = tokio::task::JoinSet::new();
    for cents in amounts {
        set.spawn(charge(cents));
    }
    let mut total = 0;
    while let Some(Ok(cents)) = set.join_next().await {
        total += cents;
    }
    total
}

fn main() {}
