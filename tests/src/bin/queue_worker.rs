//! A worker process of the queue tests: the process-wide resume worker
//! (`KEIRO_DATABASE_URL`) serving [`keiro_tests::queues::queue_job`] until
//! killed. Its one optional argument is how many instances it runs at once
//! ([`keiro::ResumeOptions::concurrency`]).

use keiro_tests::queues::queue_job;

#[tokio::main]
async fn main() {
    // Named so the queues and the workflow are linked into this binary.
    let _ = queue_job;
    let mut options = keiro::ResumeOptions::default();
    if let Some(concurrency) = std::env::args().nth(1) {
        options = options.concurrency(concurrency.parse().expect("a concurrency"));
    }
    keiro_tests::process::serve_until_killed_with(options).await;
}
