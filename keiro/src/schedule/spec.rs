//! A parsed cron expression in its time zone, and the tick arithmetic the
//! scheduler and the management calls share. Times are µs since the Unix
//! epoch, the store's unit.

use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;

use crate::{Error, Result};

/// The time zone of a schedule that names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// A cron expression (seconds field first) read in an IANA time zone.
#[derive(Debug, Clone)]
pub(crate) struct CronSpec {
    schedule: cron::Schedule,
    tz: Tz,
}

impl CronSpec {
    /// Parses `cron` and `timezone` of schedule `name`; a malformed one is
    /// [`Error::InvalidSchedule`] naming the schedule.
    pub(crate) fn parse(name: &str, cron: &str, timezone: &str) -> Result<CronSpec> {
        let schedule = cron::Schedule::from_str(cron).map_err(|e| Error::InvalidSchedule {
            name: name.to_owned(),
            reason: format!(
                "cron expression `{cron}` is malformed ({e}); write six or seven fields, \
                 seconds first, e.g. `0 0 2 * * *` for 02:00:00 every day"
            ),
        })?;
        let tz = Tz::from_str(timezone).map_err(|_| Error::InvalidSchedule {
            name: name.to_owned(),
            reason: format!(
                "time zone `{timezone}` is not an IANA time zone name; use e.g. `UTC` or \
                 `Europe/Berlin`"
            ),
        })?;
        Ok(CronSpec { schedule, tz })
    }

    /// The first tick strictly after `after_us`.
    pub(crate) fn next_after(&self, after_us: i64) -> Option<i64> {
        let at = self.at(after_us)?;
        self.schedule
            .after(&at)
            .next()
            .map(|t| t.timestamp_micros())
    }

    /// The latest tick at or before `at_us`.
    pub(crate) fn latest_until(&self, at_us: i64) -> Option<i64> {
        let at = self.at(at_us.saturating_add(1))?;
        let mut ticks = self.schedule.after(&at);
        // The iterator steps back from `at`; skip any tick it yields past it.
        (0..3)
            .filter_map(|_| ticks.next_back())
            .map(|t| t.timestamp_micros())
            .find(|&t| t <= at_us)
    }

    /// Every tick in `from_us ..= to_us`, in order, at most `limit`.
    pub(crate) fn ticks_within(&self, from_us: i64, to_us: i64, limit: usize) -> Vec<i64> {
        let mut ticks = Vec::new();
        let mut after = from_us.saturating_sub(1);
        while ticks.len() < limit {
            match self.next_after(after) {
                Some(t) if t <= to_us => {
                    ticks.push(t);
                    after = t;
                }
                _ => break,
            }
        }
        ticks
    }

    fn at(&self, us: i64) -> Option<DateTime<Tz>> {
        DateTime::<Utc>::from_timestamp_micros(us).map(|t| t.with_timezone(&self.tz))
    }
}

/// The instance id of schedule `name`'s tick at `tick_us`:
/// `cron:<name>:<tick in RFC 3339, UTC>`. Every worker derives the same id,
/// so a tick is one instance however many workers see it.
pub(crate) fn tick_id(name: &str, tick_us: i64) -> String {
    format!("cron:{name}:{}", rfc3339(tick_us))
}

/// `us` as RFC 3339 in UTC, with fractional seconds only when there are any.
pub(crate) fn rfc3339(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        .unwrap_or_else(|| us.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    #[test]
    fn next_and_latest_ticks_of_every_second_and_every_night() {
        let every = CronSpec::parse("t", "*/1 * * * * *", "UTC").unwrap();
        let t0 = 1_700_000_000 * SEC;
        assert_eq!(every.next_after(t0), Some(t0 + SEC));
        assert_eq!(every.next_after(t0 + SEC / 2), Some(t0 + SEC));
        assert_eq!(every.latest_until(t0), Some(t0));
        assert_eq!(every.latest_until(t0 + SEC / 2), Some(t0));
        assert_eq!(
            every.ticks_within(t0, t0 + 3 * SEC, 100),
            [t0, t0 + SEC, t0 + 2 * SEC, t0 + 3 * SEC]
        );
        // 2023-11-14T22:13:20Z; 02:00 in Berlin (UTC+1 in November) is 01:00Z.
        let nightly = CronSpec::parse("n", "0 0 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            rfc3339(nightly.next_after(t0).unwrap()),
            "2023-11-15T01:00:00Z"
        );
        assert_eq!(
            rfc3339(nightly.latest_until(t0).unwrap()),
            "2023-11-14T01:00:00Z"
        );
        assert_eq!(tick_id("n", t0), "cron:n:2023-11-14T22:13:20Z");
    }

    #[test]
    fn malformed_expressions_and_zones_name_the_schedule() {
        let err = CronSpec::parse("nightly", "0 0 25 * * *", "UTC").unwrap_err();
        assert!(err.to_string().contains("`nightly`"), "{err}");
        let err = CronSpec::parse("nightly", "0 0 2 * * *", "Mars/Olympus").unwrap_err();
        assert!(err.to_string().contains("Mars/Olympus"), "{err}");
    }
}
