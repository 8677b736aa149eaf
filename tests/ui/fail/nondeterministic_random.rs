use keiro::{step, workflow};

// Stands in for the `rand` crate: the lint reads the path as written.
mod rand {
    pub fn random<T: Default>() -> T {
        T::default()
    }
    pub fn thread_rng() -> u64 {
        4
    }
}

#[step]
async fn assign(reviewer: u64) -> u64 {
    reviewer
}

// A new draw on every replay: another reviewer, another journal.
#[workflow]
async fn review(reviewers: u64) -> u64 {
    let pick: u64 = rand::random();
    let second = rand::thread_rng() % reviewers;
    assign(pick % reviewers + second).await
}

fn main() {}
