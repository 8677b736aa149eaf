//! What a workflow may do instead of `tokio::spawn`: `keiro::spawn` of child
//! workflows, and `join!` of steps. `Command::spawn()` starts a process, not a
//! future, and is not refused.
use keiro::{step, workflow};

#[step]
async fn charge(cents: u64) -> u64 {
    cents
}

#[workflow]
async fn child(cents: u64) -> u64 {
    charge(cents).await
}

#[workflow]
async fn parent(a: u64, b: u64) -> Result<u64, String> {
    let first = keiro::spawn(child(a)).await.map_err(|e| e.to_string())?;
    let second = ::keiro::spawn(child(b)).await.map_err(|e| e.to_string())?;
    let (x, y) = futures::join!(charge(a), charge(b));
    let _ = std::process::Command::new("true").spawn();
    let first = first.await.map_err(|e| e.to_string())?;
    let second = second.await.map_err(|e| e.to_string())?;
    Ok(first + second + x + y)
}

pub(crate) fn main() {
    let _call: keiro::WorkflowCall<Result<u64, String>> = parent(1, 2);
}
