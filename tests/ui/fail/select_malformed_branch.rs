// Each branch of `keiro::select!` is `<pattern> = <keiro future> => <handler>`.

#[keiro::step]
async fn quick() -> u32 {
    1
}

#[keiro::workflow]
async fn racy() -> u32 {
    keiro::select! {
        v = quick() v,
        _ = keiro::sleep(std::time::Duration::from_secs(1)) => 0,
    }
}

fn main() {}
