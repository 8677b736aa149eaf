// A journal mode keiro does not have (a typo of "pipelined").
#[keiro::workflow(journal = "pipelind")]
async fn import(rows: u32) -> u32 {
    rows
}

// Not a string literal.
#[keiro::workflow(journal = pipelined)]
async fn export(rows: u32) -> u32 {
    rows
}

fn main() {}
