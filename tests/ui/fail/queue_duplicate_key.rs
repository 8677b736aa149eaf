keiro::queue!(PAYMENTS = "payments", concurrency = 10, concurrency = 5);

fn main() {
    let _ = &PAYMENTS;
}
