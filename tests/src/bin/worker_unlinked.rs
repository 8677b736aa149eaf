//! A resume worker whose binary depends on `keiro_test_linked` but never names
//! it: the trap `keiro::link!` exists for. It logs the workflows it serves
//! (tracing, to stdout) and runs until killed.

#[tokio::main]
async fn main() {
    keiro_tests::process::serve_until_killed().await;
}
