use keiro::workflow;

#[workflow]
async fn report(rows: Vec<u64>) -> u64 {
    let sum = tokio::task::spawn_blocking(move || rows.iter().sum::<u64>());
    sum.await.unwrap_or(0)
}

fn main() {}
