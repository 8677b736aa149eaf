use std::thread;

use keiro::workflow;

#[workflow]
async fn compress(data: Vec<u8>) -> usize {
    let count = |d: Vec<u8>| thread::spawn(move || d.len());
    count(data).join().unwrap_or(0)
}

fn main() {}
