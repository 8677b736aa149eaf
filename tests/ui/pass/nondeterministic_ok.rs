//! `#[keiro::nondeterministic_ok]` allows each refused form on purpose, on a
//! `let`, an expression statement, a macro statement, a `for` loop, a closure
//! and an expression inside another; the attribute is removed before rustc
//! sees it, so `#![deny(warnings)]` stays quiet.
#![deny(warnings)]

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use keiro::nondeterministic_ok;
use keiro::{step, workflow};

// Stands in for the `rand` crate: the lint reads the path as written.
mod rand {
    pub(crate) fn random<T: Default>() -> T {
        T::default()
    }
}

#[step]
async fn charge(cents: u64) -> u64 {
    cents
}

#[workflow]
async fn audited(cents: u64, tags: HashSet<String>) -> u64 {
    #[keiro::nondeterministic_ok] // only logged
    let started = Instant::now();
    #[::keiro::nondeterministic_ok]
    tokio::time::sleep(Duration::from_millis(1)).await;
    #[nondeterministic_ok]
    std::thread::sleep(Duration::from_millis(1));
    let wall = #[keiro::nondeterministic_ok]
    SystemTime::now();
    let nonce: u64 = #[keiro::nondeterministic_ok]
    rand::random();
    #[keiro::nondeterministic_ok]
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        _ = std::future::ready(()) => {}
    }
    #[keiro::nondeterministic_ok]
    let handle = tokio::spawn(async { 1u64 });
    let mut counts: HashMap<String, u64> = HashMap::new();
    counts.insert("a".into(), 1);
    // The sum does not depend on the order.
    let mut sum = 0;
    #[keiro::nondeterministic_ok]
    for (name, n) in &counts {
        sum += n + name.len() as u64;
    }
    let total: u64 = #[keiro::nondeterministic_ok]
    counts.values().sum();
    let tag_count = #[keiro::nondeterministic_ok]
    || tags.iter().filter(|t| !t.is_empty()).count();
    // A `let` allowed on purpose makes its collection free to iterate.
    #[keiro::nondeterministic_ok]
    let seen = HashSet::from([1u64]);
    let seen_sum: u64 = seen.iter().sum();
    drop((started.elapsed(), wall, nonce, handle));
    charge(cents + sum + total + tag_count() as u64 + seen_sum).await
}

/// On an item the attribute is a no-op.
#[nondeterministic_ok]
fn helper() -> u64 {
    2
}

pub(crate) fn main() {
    let _call: keiro::WorkflowCall<u64> = audited(1, HashSet::new());
    assert_eq!(helper(), 2);
}
