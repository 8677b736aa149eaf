//! Times as the command prints them: UTC, `2026-12-03 12:38:05` in tables
//! and RFC 3339 (`2026-12-03T12:38:05.123456Z`, keiro's
//! [`keiro::admin::json::rfc3339`]) in JSON.

use std::time::SystemTime;

/// `2026-12-03 12:38:05` (UTC, whole seconds): for tables. The JSON form,
/// `2026-12-03T12:38:05.123456Z`, is [`keiro::admin::json::rfc3339`].
pub(crate) fn short(time: SystemTime) -> String {
    let full = keiro::admin::json::rfc3339(time);
    match full.split_once('T') {
        Some((date, clock)) => format!("{date} {}", clock.get(..8).unwrap_or(clock)),
        None => full,
    }
}

/// A span for people: `850 ms`, `12.3 s`, `4 min 5 s`, `3 h 20 min`, `2 d 4 h`.
pub(crate) fn span(from: SystemTime, to: SystemTime) -> String {
    let d = to.duration_since(from).unwrap_or_default();
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        _ if ms < 1000 => format!("{ms} ms"),
        0..=59 => format!("{:.1} s", d.as_secs_f64()),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long ago `time` was, compactly (see [`duration`]; a time in the
/// future reads as now: `0ms`).
pub(crate) fn age(time: SystemTime, now: SystemTime) -> String {
    duration(now.duration_since(time).unwrap_or_default())
}

/// A duration, compactly: `850ms`, `12s`, `4m05s`, `3h20m`, `2d04h`.
pub(crate) fn duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn known_instants() {
        assert_eq!(short(UNIX_EPOCH), "1970-01-01 00:00:00");
        let t = UNIX_EPOCH + Duration::from_micros(1_796_301_485_123_456);
        assert_eq!(short(t), "2026-12-03 12:38:05");
        // A leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(short(leap), "2000-02-29 00:00:00");
        let before = UNIX_EPOCH - Duration::from_micros(1);
        assert_eq!(short(before), "1969-12-31 23:59:59");
    }

    #[test]
    fn ages() {
        let t = UNIX_EPOCH;
        assert_eq!(age(t, t + Duration::from_millis(850)), "850ms");
        assert_eq!(age(t, t + Duration::from_secs(12)), "12s");
        assert_eq!(age(t, t + Duration::from_secs(245)), "4m05s");
        assert_eq!(age(t, t + Duration::from_secs(12_000)), "3h20m");
        assert_eq!(age(t, t + Duration::from_secs(187_200)), "2d04h");
        assert_eq!(age(t + Duration::from_secs(1), t), "0ms");
    }

    #[test]
    fn spans() {
        let t = UNIX_EPOCH;
        assert_eq!(span(t, t + Duration::from_millis(850)), "850 ms");
        assert_eq!(span(t, t + Duration::from_millis(12_340)), "12.3 s");
        assert_eq!(span(t, t + Duration::from_secs(245)), "4 min 5 s");
        assert_eq!(span(t, t + Duration::from_secs(12_000)), "3 h 20 min");
        assert_eq!(span(t, t + Duration::from_secs(187_200)), "2 d 4 h");
        assert_eq!(span(t + Duration::from_secs(1), t), "0 ms");
    }
}
