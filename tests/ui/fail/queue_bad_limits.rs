// Each declaration holds one mistake in its limits; the macro refuses each
// at the value, saying how to write it.
use std::time::Duration;

keiro::queue!(NO_WORKER = "no-worker", worker_concurrency = 0);
keiro::queue!(NO_STARTS = "no-starts", rate_limit = (0, Duration::from_secs(1)));
keiro::queue!(NO_WINDOW = "no-window", rate_limit = (5, Duration::ZERO));
keiro::queue!(NO_MILLIS = "no-millis", rate_limit = (5, Duration::from_millis(0)));
keiro::queue!(NOT_A_PAIR = "not-a-pair", rate_limit = 100);
keiro::queue!(BARE_PERIOD = "bare-period", rate_limit = (100, 60));
keiro::queue!(NEGATIVE = "negative", concurrency = -1);
keiro::queue!(QUOTED = "quoted", concurrency = "10");
keiro::queue!(TOO_MANY = "too-many", concurrency = 2, worker_concurrency = 4);

fn main() {
    let _ = (&NO_WORKER, &NO_STARTS, &NO_WINDOW, &NO_MILLIS, &NOT_A_PAIR);
    let _ = (&BARE_PERIOD, &NEGATIVE, &QUOTED, &TOO_MANY);
    let _ = Duration::from_secs(1);
}
