// A branch of `keiro::select!` must be a keiro future: a plain future cannot
// be replayed, so its race could not be journaled.

#[keiro::workflow]
async fn racy() -> u32 {
    keiro::select! {
        v = async { 1u32 } => v,
        _ = keiro::sleep(std::time::Duration::from_secs(1)) => 0,
    }
}

fn main() {}
