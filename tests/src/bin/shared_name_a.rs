//! One of two binaries registering a workflow named `shared_greeting`: here
//! it takes a number. See `keiro_tests::shared_name`.

use keiro::workflow;

#[workflow(name = "shared_greeting")]
async fn greeting(n: u32) -> String {
    format!("A:{n}")
}

#[tokio::main]
async fn main() {
    keiro_tests::shared_name::drive(
        |id| async move { greeting(7).id(id).enqueue().await.map(drop) },
    )
    .await
}
