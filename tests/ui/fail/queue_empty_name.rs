keiro::queue!(PAYMENTS = "", concurrency = 10);

fn main() {
    let _ = &PAYMENTS;
}
