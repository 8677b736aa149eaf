use keiro::step;

struct Hold {
    id: u64,
}

#[step]
async fn reserve(id: u64) -> Hold {
    Hold { id }
}

fn main() {}
