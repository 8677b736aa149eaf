//! One of two binaries registering a workflow named `shared_greeting`: here
//! it takes a name. See `keiro_tests::shared_name`.

use keiro::workflow;

#[workflow(name = "shared_greeting")]
async fn greeting(name: String) -> String {
    format!("B:{name}")
}

#[tokio::main]
async fn main() {
    keiro_tests::shared_name::drive(|id| async move {
        greeting("ada".into()).id(id).enqueue().await.map(drop)
    })
    .await
}
