//! A workflow deadline: an order waits for an approval that never comes, and
//! its deadline ends it (as `TimedOut`) instead of leaving it waiting forever.
//!
//! ```text
//! cargo run -p keiro-examples --example deadline
//! ```
//!
//! With no `KEIRO_DATABASE_URL` it journals into `keiro.db` in the working
//! directory (created if missing).

use std::time::{Duration, Instant};

use keiro::{workflow, Error, WorkflowStatus};

#[workflow]
async fn await_approval(order: String) -> Result<String, String> {
    let approval = keiro::awakeable::<bool>().await;
    println!(
        "  {order}: waiting for an answer to awakeable {}",
        approval.id()
    );
    let approved = approval.await.map_err(|e| e.to_string())?;
    Ok(format!("{order} approved: {approved}"))
}

#[tokio::main]
async fn main() -> Result<(), keiro::Error> {
    let id = format!("approval-{}", keiro::Uuid::new_v4().simple());
    let started = Instant::now();
    // The deadline is stored with the instance: a restart keeps it.
    let handle = await_approval("order-42".into())
        .id(&id)
        .timeout(Duration::from_secs(2))
        .start()
        .await?;
    match handle.result().await {
        Err(error @ Error::TimedOut { .. }) => {
            println!("after {:.1?}: {error}", started.elapsed());
        }
        other => println!("unexpected: {other:?}"),
    }
    assert_eq!(handle.status().await?, WorkflowStatus::TimedOut);
    Ok(())
}
