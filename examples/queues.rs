//! Queues: at most three charges at once across every worker, at most 20
//! starts a second, an urgent order first, and a second enqueue of a live
//! order refused.
//!
//! ```text
//! cargo run -p keiro-examples --example queues
//! ```
//!
//! With no `KEIRO_DATABASE_URL` the instances live in `keiro.db`; set it to
//! a `postgres://` URL and start the same binary twice to watch two worker
//! processes share the limits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use keiro::{step, workflow, Error, ResumeOptions};

keiro::queue!(
    /// The payment provider takes at most three calls at once, 20 a second.
    PAYMENTS = "payments",
    concurrency = 3,
    rate_limit = (20, Duration::from_secs(1))
);

/// Charges running right now in this process, and the most seen at once.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);

/// Calls the (pretend) payment provider.
#[step]
async fn call_provider(customer: String, cents: u64) -> Result<String, String> {
    let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    MOST.fetch_max(now, Ordering::SeqCst);
    println!("  calling the provider: {customer}, {cents} cents ({now} running)");
    tokio::time::sleep(Duration::from_millis(50)).await;
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    Ok(format!("charged {customer} {cents}"))
}

/// One order's charge.
#[workflow]
async fn charge(customer: String, cents: u64) -> Result<String, String> {
    call_provider(customer, cents).await
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let keiro = keiro::global().await?;
    let run = uuid_like();
    let mut handles = Vec::new();
    for n in 0..12u64 {
        let customer = format!("customer-{}", n % 4);
        let order = format!("order-{run}-{n}");
        let handle = charge(customer.clone(), 100 + n)
            .id(&order)
            .queue(&PAYMENTS)
            .priority(if n == 11 { 0 } else { 1 }) // the last one enqueued starts in the first batch
            .dedup(&order) // the same order twice while unfinished: refused
            .enqueue()
            .await?;
        handles.push(handle);
    }
    // Enqueueing order 0 again under another id while it waits is refused.
    let again = charge("customer-0".into(), 100)
        .id(format!("order-{run}-0-again"))
        .queue(&PAYMENTS)
        .dedup(format!("order-{run}-0"))
        .enqueue()
        .await;
    match again {
        Err(Error::Duplicate { existing_id, .. }) => {
            println!("duplicate refused: {existing_id} holds the key")
        }
        other => panic!("expected a duplicate refusal, got {other:?}"),
    }
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(20)))
        .await?;
    for handle in &handles {
        println!("{}: {:?}", handle.id(), handle.result().await?);
    }
    worker.shutdown().await;
    println!(
        "at most {} charges ran at once",
        MOST.load(Ordering::SeqCst)
    );
    Ok(())
}

/// A per-run suffix, so the example can run again on the same database.
fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
