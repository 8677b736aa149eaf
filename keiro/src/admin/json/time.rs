//! RFC 3339 times in UTC, from the civil calendar (no time zone database).

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

/// `time` in UTC with microseconds, e.g. `2026-12-03T12:38:05.123456Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let (secs, micros) = since_epoch(time);
    let (year, month, day) = civil(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_796_301_485_123_456);
        assert_eq!(rfc3339(t), "2026-12-03T12:38:05.123456Z");
        // A leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
        let before = UNIX_EPOCH - Duration::from_micros(1);
        assert_eq!(rfc3339(before), "1969-12-31T23:59:59.999999Z");
    }
}
