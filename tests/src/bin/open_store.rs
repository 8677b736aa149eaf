//! Opens (creating and migrating) the store at the URL given as the first
//! argument, once the Unix time in milliseconds reaches the second argument, so
//! that several processes race their first open of one fresh file. Exits 0 on
//! success, 1 with the error on stderr otherwise.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: open_store <url> <start-at-unix-ms>");
    let start: u128 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    if start > now {
        std::thread::sleep(Duration::from_millis((start - now) as u64));
    }
    match keiro_store::Store::connect(&url, &keiro_store::StoreOptions::default()).await {
        Ok(_) => {}
        Err(e) => {
            eprintln!("{e}: {e:?}");
            std::process::exit(1);
        }
    }
}
