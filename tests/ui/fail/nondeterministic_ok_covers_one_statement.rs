use std::time::SystemTime;

use keiro::workflow;

// The attribute allows the statement it is on, not the ones after it.
#[workflow]
async fn stamp() -> bool {
    #[keiro::nondeterministic_ok]
    let logged = SystemTime::now();
    let decided = SystemTime::now();
    logged < decided
}

fn main() {}
