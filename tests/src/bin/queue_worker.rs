//! A worker process of the queue tests: the process-wide resume worker
//! (`KEIRO_DATABASE_URL`) serving [`keiro_tests::queues::queue_job`] until
//! killed.

use keiro_tests::queues::queue_job;

#[tokio::main]
async fn main() {
    // Named so the queues and the workflow are linked into this binary.
    let _ = queue_job;
    keiro_tests::process::serve_until_killed().await;
}
