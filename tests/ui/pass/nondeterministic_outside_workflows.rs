//! The determinism lints read only the workflow's own body: step bodies,
//! `fn` items declared inside the workflow, and the keiro replacements
//! (`keiro::now`, `keiro::sleep`, `keiro::select!`, `BTreeMap`, a
//! `HashMap` shadowed by a `BTreeMap`) compile. The attribute is also
//! removed from a step body.
#![deny(warnings)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use keiro::{step, workflow};

#[step]
async fn measure(label: String) -> (String, u64) {
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut counts: HashMap<String, u64> = HashMap::new();
    counts.insert(label.clone(), 1);
    let total: u64 = counts.values().sum();
    #[keiro::nondeterministic_ok]
    let _wall = SystemTime::now();
    (label, started.elapsed().as_millis() as u64 + total)
}

#[workflow]
async fn report(labels: Vec<String>) -> u64 {
    fn stamp() -> SystemTime {
        SystemTime::now()
    }
    let _ = stamp;
    let now = keiro::now().await;
    keiro::sleep(Duration::from_millis(1)).await;
    let first = keiro::select! {
        done = measure("first".into()) => done.1,
        _ = keiro::sleep(Duration::from_secs(1)) => 0,
    };
    let mut ordered: BTreeMap<String, u64> = BTreeMap::new();
    for label in labels {
        let (label, ms) = measure(label).await;
        ordered.insert(label, ms);
    }
    let mut total = first;
    for (label, ms) in &ordered {
        total += ms + label.len() as u64;
    }
    let counts = HashMap::from([("a", 1u64)]);
    // Collected into a sorted collection: the order is fixed again.
    let sorted: BTreeMap<_, _> = counts.iter().map(|(k, v)| (*k, *v)).collect();
    let keys = counts.keys().collect::<BTreeSet<_>>();
    total += sorted.len() as u64 + keys.len() as u64;
    let counts: BTreeMap<_, _> = counts.into_iter().collect();
    for (name, n) in &counts {
        total += n + name.len() as u64;
    }
    let _ = now;
    total
}

pub(crate) fn main() {
    let _call: keiro::WorkflowCall<u64> = report(vec![]);
}
