use std::sync::atomic::{AtomicU32, Ordering};

use keiro::step;

static FLAKY_CALLS: AtomicU32 = AtomicU32::new(0);
static DOOMED_CALLS: AtomicU32 = AtomicU32::new(0);

/// Fails twice, then succeeds; each attempt gets its own copy of the arguments.
#[step(max_attempts = 5, backoff_ms = 1)]
async fn flaky(to: String, mut body: String) -> Result<String, String> {
    body.push('!');
    if FLAKY_CALLS.fetch_add(1, Ordering::SeqCst) < 2 {
        return Err(format!("try again: {body}"));
    }
    Ok(format!("{to}: {body}"))
}

/// Always fails: runs `max_attempts` times and returns the last `Err`.
#[step(max_attempts = 3, backoff_ms = 0)]
async fn doomed(attempt_label: String) -> Result<(), String> {
    let n = DOOMED_CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    Err(format!("{attempt_label} {n}"))
}

mod mail {
    /// A `Result` alias: retries only need the last path segment to be `Result`.
    pub type Result<T> = std::result::Result<T, String>;
}

#[step(name = "send_email", max_attempts = 3)]
async fn email(to: String) -> mail::Result<()> {
    drop(to);
    Ok(())
}

#[step(max_attempts = 1)]
async fn once() -> u32 {
    1
}

#[tokio::main]
pub(crate) async fn main() {
    // Outside a workflow the retries still apply, without a journal.
    assert_eq!(
        flaky("ops".to_owned(), "hello".to_owned()).await,
        Ok("ops: hello!".to_owned())
    );
    assert_eq!(FLAKY_CALLS.load(Ordering::SeqCst), 3);

    assert_eq!(
        doomed("attempt".to_owned()).await,
        Err("attempt 3".to_owned())
    );
    assert_eq!(DOOMED_CALLS.load(Ordering::SeqCst), 3);

    email("ops".to_owned()).await.unwrap();
    assert_eq!(once().await, 1);
}
