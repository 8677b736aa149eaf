//! Times as the command prints them: UTC, `2026-12-03 12:38:05` in tables
//! and RFC 3339 (`2026-12-03T12:38:05.123456Z`) in JSON.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds and microseconds since the Unix epoch (negative before it).
fn since_epoch(time: SystemTime) -> (i64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_micros()),
        Err(e) => {
            let d = e.duration();
            let micros = d.subsec_micros();
            if micros == 0 {
                (-(d.as_secs() as i64), 0)
            } else {
                (-(d.as_secs() as i64) - 1, 1_000_000 - micros)
            }
        }
    }
}

/// The civil date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DD`, `hh:mm:ss` and the microseconds of `time`, in UTC.
fn parts(time: SystemTime) -> (String, String, u32) {
    let (secs, micros) = since_epoch(time);
    let (year, month, day) = civil(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!(
            "{:02}:{:02}:{:02}",
            of_day / 3600,
            of_day % 3600 / 60,
            of_day % 60
        ),
        micros,
    )
}

/// `2026-12-03 12:38:05` (UTC, whole seconds): for tables.
pub(crate) fn short(time: SystemTime) -> String {
    let (date, clock, _) = parts(time);
    format!("{date} {clock}")
}

/// `2026-12-03T12:38:05.123456Z`: for JSON.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let (date, clock, micros) = parts(time);
    format!("{date}T{clock}.{micros:06}Z")
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
    use std::time::Duration;

    #[test]
    fn known_instants() {
        assert_eq!(short(UNIX_EPOCH), "1970-01-01 00:00:00");
        let t = UNIX_EPOCH + Duration::from_micros(1_796_301_485_123_456);
        assert_eq!(short(t), "2026-12-03 12:38:05");
        assert_eq!(rfc3339(t), "2026-12-03T12:38:05.123456Z");
        // A leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(short(leap), "2000-02-29 00:00:00");
        let before = UNIX_EPOCH - Duration::from_micros(1);
        assert_eq!(rfc3339(before), "1969-12-31T23:59:59.999999Z");
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
