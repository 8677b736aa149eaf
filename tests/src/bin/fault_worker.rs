//! The worker process of the fault tests: runs `checked_steps` instances
//! (and every other linked workflow) from `KEIRO_DATABASE_URL` until killed.
//! See `keiro_tests::faults::run_fault_worker`.

#[tokio::main]
async fn main() {
    keiro_tests::faults::run_fault_worker().await;
}
