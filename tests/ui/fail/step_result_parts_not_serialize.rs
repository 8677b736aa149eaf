use keiro::step;

struct Hold;

// The `Ok` type of a (retried) step cannot be journaled: named as such.
#[step(max_attempts = 2)]
async fn reserve(id: u64) -> Result<Hold, String> {
    let _ = id;
    Ok(Hold)
}

// Neither part can be journaled: each is named, with its own advice.
#[step]
async fn reserve_or_fail(id: u64) -> Result<Hold, std::io::Error> {
    let _ = id;
    Ok(Hold)
}

fn main() {}
