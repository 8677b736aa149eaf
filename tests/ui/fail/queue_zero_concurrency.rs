keiro::queue!(PAYMENTS = "payments", concurrency = 0);

fn main() {
    let _ = &PAYMENTS;
}
