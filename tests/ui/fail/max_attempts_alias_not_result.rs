use keiro::step;

/// An alias of a type that is not a `Result`: retries have nothing to retry on.
type Count = u32;

#[step(max_attempts = 3)]
async fn count(n: u32) -> Count {
    n + 1
}

fn main() {}
