use keiro::{step, workflow};

#[step]
async fn notify(to: String) {
    drop(to);
}

#[workflow]
async fn announce(emails: Vec<String>) {
    let unique = emails.into_iter().collect::<std::collections::HashSet<_>>();
    for to in unique.into_iter() {
        notify(to).await;
    }
}

fn main() {}
