use std::sync::atomic::{AtomicU32, Ordering};

use keiro::step;

static CALLS: AtomicU32 = AtomicU32::new(0);

#[step(max_attempts = 5, backoff_ms = 1)]
async fn flaky(to: String, body: String) -> Result<String, String> {
    if CALLS.fetch_add(1, Ordering::SeqCst) < 2 {
        return Err("try again".to_owned());
    }
    Ok(format!("{to}: {body}"))
}

#[step(name = "send_email", max_attempts = 3)]
async fn email(to: String) -> std::io::Result<()> {
    drop(to);
    Ok(())
}

#[step(max_attempts = 1)]
async fn once() -> u32 {
    1
}

#[tokio::main]
async fn main() {
    let sent = flaky("ops".to_owned(), "hello".to_owned()).await;
    assert!(sent.is_ok() || sent.is_err());
    email("ops".to_owned()).await.unwrap();
    assert_eq!(once().await, 1);
}
