keiro::queue!(PAYMENTS = "payments", max_running = 10);

fn main() {
    let _ = &PAYMENTS;
}
