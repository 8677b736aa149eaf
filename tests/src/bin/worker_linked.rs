//! The same resume worker as `worker_unlinked`, with the workflow crate kept
//! by `keiro::link!`.

keiro::link!(keiro_test_linked);

#[tokio::main]
async fn main() {
    keiro_tests::process::serve_until_killed().await;
}
