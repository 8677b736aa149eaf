use std::collections::HashMap;

use keiro::{step, workflow};

#[step]
async fn bill(customer: String, cents: u64) -> u64 {
    drop(customer);
    cents
}

// Steps called in hash order get other sequence numbers in another process.
#[workflow]
async fn invoice(lines: Vec<(String, u64)>, extra: HashMap<String, u64>) -> u64 {
    let mut totals: HashMap<String, u64> = HashMap::new();
    for (customer, cents) in lines {
        *totals.entry(customer).or_default() += cents;
    }
    let mut billed = 0;
    for (customer, cents) in &totals {
        billed += bill(customer.clone(), *cents).await;
    }
    let by_name = HashMap::from([("a", 1)]);
    let names: Vec<_> = by_name.keys().collect();
    for cents in extra.values() {
        billed += cents;
    }
    billed + names.len() as u64
}

fn main() {}
