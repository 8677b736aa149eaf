use keiro::{step, workflow};
use tokio::task;

#[step]
async fn notify(to: String) {
    drop(to);
}

#[workflow]
async fn signup(email: String) {
    // Inside a nested block and an `async` block: the scan walks them all.
    if !email.is_empty() {
        let _ = async move {
            task::spawn_local(notify(email));
        };
    }
}

fn main() {}
