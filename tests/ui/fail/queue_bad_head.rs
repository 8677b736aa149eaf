// The static and the queue's name come first, and the name is one the
// store can keep.
keiro::queue!(concurrency = 10);
keiro::queue!(PAYMENTS = payments, concurrency = 10);
keiro::queue!(BLANK = "   ", concurrency = 10);
keiro::queue!(NUL = "pay\0ments");

fn main() {
    let _ = (&BLANK, &NUL);
}
