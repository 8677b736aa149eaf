// A durable select always has a winner: there is no `else` branch.

#[keiro::workflow]
async fn racy() -> u32 {
    keiro::select! {
        _ = keiro::sleep(std::time::Duration::from_secs(1)) => 1,
        else => 0,
    }
}

fn main() {}
