// A `keiro::select!` with no branch has nothing to race.

#[keiro::workflow]
async fn racy() -> u32 {
    keiro::select! {}
}

fn main() {}
