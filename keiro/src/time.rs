//! The store's unit of time, microseconds since the Unix epoch, and the
//! conversions from and to the `SystemTime`s and `Duration`s of keiro's API.
//!
//! Every time keiro writes to or reads from the store (lease expiries, wake
//! times, heartbeats, timer fire times, sleep deadlines in the journal) goes
//! through these, so the unit is spelled in one place.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, saturating (times before 1970 are 0).
pub(crate) fn to_us(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The time `us` microseconds after the Unix epoch (negative values are the
/// epoch).
pub(crate) fn from_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

/// A duration in whole microseconds, saturating; at least 1 for a non-zero one.
pub(crate) fn duration_us(duration: Duration) -> i64 {
    let us = i64::try_from(duration.as_micros()).unwrap_or(i64::MAX);
    if us == 0 && !duration.is_zero() {
        1
    } else {
        us
    }
}

/// How long from `now` (µs since the Unix epoch) until `at`, zero when it has
/// passed.
pub(crate) fn until_us(at: i64, now: i64) -> Duration {
    Duration::from_micros(at.saturating_sub(now).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_to_the_microsecond() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(to_us(t), 1_700_000_000_123_456);
        assert_eq!(
            from_us(to_us(t)),
            UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_000)
        );
        assert_eq!(to_us(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(from_us(-5), UNIX_EPOCH);
    }

    #[test]
    fn durations_saturate_and_never_round_to_zero() {
        assert_eq!(duration_us(Duration::from_millis(3)), 3_000);
        assert_eq!(duration_us(Duration::from_nanos(1)), 1);
        assert_eq!(duration_us(Duration::ZERO), 0);
        assert_eq!(duration_us(Duration::MAX), i64::MAX);
        assert_eq!(until_us(5_000, 2_000), Duration::from_millis(3));
        assert_eq!(until_us(2_000, 5_000), Duration::ZERO);
    }
}
