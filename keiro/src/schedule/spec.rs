//! A parsed cron expression in its time zone, and the tick arithmetic the
//! scheduler and the management calls share. Times are µs since the Unix
//! epoch, the store's unit.

use std::str::FromStr;

use chrono::{DateTime, LocalResult, Offset, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use cron::TimeUnitSpec;

use crate::{Error, Result};

/// The time zone of a schedule that names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// The most spans of one offset (or repeated wall times) one search for the
/// next tick crosses before giving up.
const MAX_STEPS: usize = 64;

/// The step at which a search probes for a change of the zone's offset.
const PROBE_US: i64 = 7 * 86_400 * 1_000_000;

/// A year and a day, in µs: how far past the last real tick a skipped wall
/// time is looked for.
const YEAR_US: i64 = 367 * 86_400 * 1_000_000;

/// More than any zone's clocks ever moved at once.
const MAX_SHIFT_US: i64 = 3 * 3_600 * 1_000_000;

/// The most ticks [`CronSpec::latest_until`] walks forward (three hours of
/// an every-second schedule).
const MAX_WALK: usize = 3 * 3_600 + 16;

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

    /// [`CronSpec::parse`] for a schedule being defined now, which also
    /// refuses a day-of-week field that numbers its days: the `cron` crate
    /// counts 1 = Sunday, crontab 1 = Monday, so `1-5` would silently run
    /// Sunday to Thursday. Names (`MON-FRI`) mean the same everywhere.
    /// Stored schedules are read with [`CronSpec::parse`], so one defined
    /// before this check keeps running.
    pub(crate) fn parse_new(name: &str, cron: &str, timezone: &str) -> Result<CronSpec> {
        let spec = CronSpec::parse(name, cron, timezone)?;
        if let Some(field) = numeric_day_of_week(cron) {
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: format!(
                    "the day-of-week field `{field}` of cron expression `{cron}` numbers its \
                     days, and this cron counts 1 = Sunday to 7 = Saturday where crontab counts \
                     0 = Sunday, 1 = Monday; name the days instead, e.g. `MON-FRI` or `SAT,SUN`"
                ),
            });
        }
        Ok(spec)
    }

    /// The first tick strictly after `after_us`: the first instant whose
    /// wall-clock time in the zone matches the expression.
    ///
    /// Across a change of the zone's offset it never goes back: each span of
    /// one offset is searched in turn. A wall time skipped when clocks go
    /// forward ticks at the instant it would have shown had they not moved
    /// (read with the offset before the change, as Java's, Python's and
    /// JavaScript Temporal's time libraries resolve it): a nightly 02:30 in
    /// Berlin runs at 03:30 on the night the clocks skip 02:00 to 03:00,
    /// and one that lands on the instant of a real tick runs once. Wall
    /// times repeated when clocks go back tick at their first occurrence
    /// only, unless the expression matches every hour (`*` in the hour
    /// field): then they tick at both, so an every-minute schedule runs each
    /// real minute of the repeated hour.
    pub(crate) fn next_after(&self, after_us: i64) -> Option<i64> {
        match self.next_real_after(after_us) {
            Some(real) => Some(match self.next_skipped_after(after_us, real) {
                Some(skipped) => skipped.min(real),
                None => real,
            }),
            // No real tick left (an expression bound to a date or a year):
            // a skipped wall time within a year may still be the last one.
            None => self.next_skipped_after(after_us, after_us.saturating_add(YEAR_US)),
        }
    }

    /// The first tick after `after_us` at a wall time that exists.
    fn next_real_after(&self, after_us: i64) -> Option<i64> {
        let every_hour = self.schedule.hours().is_all();
        let mut after = after_us;
        for _ in 0..MAX_STEPS {
            // The offset of the instants just after `after`, and the wall
            // time `after` shows under it.
            let offset = self.offset_us(after.checked_add(1)?)?;
            let wall = DateTime::<Utc>::from_timestamp_micros(after.checked_add(offset)?)?;
            let matched = self.schedule.after(&wall).next()?.timestamp_micros();
            let tick = matched.checked_sub(offset)?;
            if let Some(change) = self.first_change(after, tick, offset)? {
                // The offset changes first: search on from there, under the
                // new offset.
                after = change - 1;
                continue;
            }
            if every_hour {
                return Some(tick);
            }
            match self.repeat_of(matched, tick) {
                // A repeat of an earlier wall time: none of the repeated span
                // ticks, so search on from its end in one step.
                Some(earlier) => after = self.repeat_end(earlier, tick)?.max(tick),
                None => return Some(tick),
            }
        }
        None
    }

    /// The latest tick at or before `at_us`.
    pub(crate) fn latest_until(&self, at_us: i64) -> Option<i64> {
        let at = self.at(at_us.saturating_add(1))?;
        let mut ticks = self.schedule.after(&at);
        // Stepping back finds a match at or before `at_us`; across a repeated
        // hour it may miss a later tick, or land on a repeat that does not
        // tick, so walk forward from there (from before the repeat, if
        // nothing follows it).
        let found = (0..3)
            .filter_map(|_| ticks.next_back())
            .map(|t| t.timestamp_micros())
            .find(|&t| t <= at_us)?;
        self.last_tick_within(found - 1, at_us)
            .or_else(|| self.last_tick_within(found - MAX_SHIFT_US, at_us))
    }

    /// The first tick in `(after_us, until_us]` of a wall time skipped when
    /// the clocks went forward, at the instant it would have shown under
    /// the offset before the change: those instants lie in `[change,
    /// change + jump)`, so the changes looked at are those from
    /// [`MAX_SHIFT_US`] before `after_us` to `until_us`.
    fn next_skipped_after(&self, after_us: i64, until_us: i64) -> Option<i64> {
        let mut from = after_us.saturating_sub(MAX_SHIFT_US);
        for _ in 0..MAX_STEPS {
            let before = self.offset_us(from.checked_add(1)?)?;
            let change = self.first_change(from, until_us, before)??;
            let after = self.offset_us(change)?;
            if after > before {
                // Wall times `change + before ..` up to `change + after`
                // never show; matched under `before`, the first of them
                // after `after_us` (if any) ticks at `wall - before`.
                let from_wall = after_us.max(change - 1).checked_add(before)?;
                let wall = DateTime::<Utc>::from_timestamp_micros(from_wall)?;
                let matched = self.schedule.after(&wall).next()?.timestamp_micros();
                if matched < change.checked_add(after)? {
                    let tick = matched.checked_sub(before)?;
                    return (tick <= until_us).then_some(tick);
                }
            }
            from = change;
        }
        None
    }

    /// The last tick in `(after_us, to_us]`, if any.
    fn last_tick_within(&self, after_us: i64, to_us: i64) -> Option<i64> {
        let mut last = None;
        let mut after = after_us;
        for _ in 0..MAX_WALK {
            match self.next_after(after) {
                Some(t) if t <= to_us => {
                    last = Some(t);
                    after = t;
                }
                _ => break,
            }
        }
        last
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

    /// The zone's offset from UTC at instant `us`, in µs.
    fn offset_us(&self, us: i64) -> Option<i64> {
        let utc = DateTime::<Utc>::from_timestamp_micros(us)?;
        let offset = self.tz.offset_from_utc_datetime(&utc.naive_utc()).fix();
        Some(i64::from(offset.local_minus_utc()) * 1_000_000)
    }

    /// The first instant in `(from_us, to_us]` whose offset is not
    /// `offset`, if any (the outer `None` only past the calendar's range).
    /// Zones change
    /// their offset at most a few times a year, never twice within
    /// [`PROBE_US`], so probing at that step finds every change.
    fn first_change(&self, from_us: i64, to_us: i64, offset: i64) -> Option<Option<i64>> {
        let (mut same, mut at) = (from_us, from_us);
        let mut other = None;
        while at < to_us {
            at = at.saturating_add(PROBE_US).min(to_us);
            if self.offset_us(at)? != offset {
                other = Some(at);
                break;
            }
            same = at;
        }
        let Some(mut other) = other else {
            return Some(None);
        };
        // The offset is `offset` at `same` and another at `other`.
        while other - same > 1 {
            let mid = same + (other - same) / 2;
            if self.offset_us(mid)? == offset {
                same = mid;
            } else {
                other = mid;
            }
        }
        Some(Some(other))
    }

    /// Whether wall time `wall_us` (µs, read as UTC) happens twice in the
    /// zone and `tick` is its second occurrence.
    /// The earlier instant showing wall time `wall_us`, when `tick` is the
    /// later of two (a time repeated as clocks went back).
    fn repeat_of(&self, wall_us: i64, tick: i64) -> Option<i64> {
        let wall = DateTime::<Utc>::from_timestamp_micros(wall_us)?;
        match self.tz.from_local_datetime(&wall.naive_utc()) {
            LocalResult::Ambiguous(a, b) => {
                let earlier = a.timestamp_micros().min(b.timestamp_micros());
                (earlier < tick).then_some(earlier)
            }
            _ => None,
        }
    }

    /// The last instant of the repeated span `tick` lies in, given `earlier`,
    /// the first instant showing `tick`'s wall time: the span starts where the
    /// offset changed after `earlier` and lasts as long as the clocks went
    /// back (`tick - earlier`).
    fn repeat_end(&self, earlier: i64, tick: i64) -> Option<i64> {
        let before = self.offset_us(earlier)?;
        let change = self.first_change(earlier, tick, before)?.unwrap_or(tick);
        Some(change + (tick - earlier) - 1)
    }

    fn at(&self, us: i64) -> Option<DateTime<Tz>> {
        DateTime::<Utc>::from_timestamp_micros(us).map(|t| t.with_timezone(&self.tz))
    }
}

/// The day-of-week field of a six- or seven-field expression when it
/// numbers days (a range, a list or a step).
fn numeric_day_of_week(expression: &str) -> Option<&str> {
    let field = expression.split_whitespace().nth(5)?;
    field.bytes().any(|b| b.is_ascii_digit()).then_some(field)
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
    fn a_new_schedule_names_its_days_of_the_week() {
        let err = CronSpec::parse_new("weekdays", "0 0 9 * * 1-5", "UTC").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("`weekdays`") && text.contains("MON-FRI"),
            "{text}"
        );
        assert!(CronSpec::parse_new("w", "0 0 9 * * */2", "UTC").is_err());
        assert!(CronSpec::parse_new("w", "0 0 9 * * MON-FRI", "UTC").is_ok());
        assert!(CronSpec::parse_new("w", "0 0 9 1 * *", "UTC").is_ok());
        // A stored one still reads.
        assert!(CronSpec::parse("weekdays", "0 0 9 * * 1-5", "UTC").is_ok());
    }

    #[test]
    fn malformed_expressions_and_zones_name_the_schedule() {
        let err = CronSpec::parse("nightly", "0 0 25 * * *", "UTC").unwrap_err();
        assert!(err.to_string().contains("`nightly`"), "{err}");
        let err = CronSpec::parse("nightly", "0 0 2 * * *", "Mars/Olympus").unwrap_err();
        assert!(err.to_string().contains("Mars/Olympus"), "{err}");
    }

    /// Berlin's clocks went back at 2024-10-27T01:00Z (03:00 CEST became
    /// 02:00 CET) and forward at 2024-03-31T01:00Z (02:00 CET became 03:00
    /// CEST).
    fn berlin(cron: &str) -> CronSpec {
        CronSpec::parse("t", cron, "Europe/Berlin").unwrap()
    }

    fn at(rfc: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc)
            .unwrap()
            .timestamp_micros()
    }

    fn shown(ticks: &[i64]) -> Vec<String> {
        ticks.iter().map(|&t| rfc3339(t)).collect()
    }

    #[test]
    fn an_every_minute_schedule_ticks_each_real_minute_of_a_repeated_hour() {
        let every = berlin("0 * * * * *");
        let ticks =
            every.ticks_within(at("2024-10-27T00:30:00Z"), at("2024-10-27T02:30:00Z"), 1000);
        assert_eq!(ticks.len(), 121, "{:?}", shown(&ticks));
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 60 * SEC));
        // From inside the repeated hour, the next tick is the next minute,
        // never one of the hour's first pass.
        assert_eq!(
            rfc3339(every.next_after(at("2024-10-27T01:10:00Z")).unwrap()),
            "2024-10-27T01:11:00Z"
        );
        assert_eq!(
            rfc3339(every.latest_until(at("2024-10-27T01:10:30Z")).unwrap()),
            "2024-10-27T01:10:00Z"
        );
        let seconds = berlin("*/1 * * * * *");
        assert_eq!(
            rfc3339(seconds.next_after(at("2024-10-27T00:59:59Z")).unwrap()),
            "2024-10-27T01:00:00Z"
        );
    }

    #[test]
    fn a_schedule_of_many_ticks_in_a_repeated_hour_finds_the_tick_after_it() {
        // 360 ticks in each pass of 02:00 to 02:59: the second pass's are
        // repeats, passed over at once, not one search step each.
        let tens = berlin("*/10 * 2-3 * * *");
        assert_eq!(
            rfc3339(tens.next_after(at("2024-10-27T00:59:50Z")).unwrap()),
            "2024-10-27T02:00:00Z"
        );
        assert_eq!(
            rfc3339(tens.next_after(at("2024-10-27T01:30:00Z")).unwrap()),
            "2024-10-27T02:00:00Z"
        );
        let ticks = tens.ticks_within(at("2024-10-27T00:00:00Z"), at("2024-10-27T02:00:00Z"), 1000);
        assert_eq!(ticks.len(), 361, "{:?}", shown(&ticks));
        assert_eq!(rfc3339(ticks[360]), "2024-10-27T02:00:00Z");
    }

    #[test]
    fn a_daily_tick_in_a_repeated_hour_runs_once_and_one_in_a_skipped_hour_an_hour_on() {
        let nightly = berlin("0 30 2 * * *");
        let autumn =
            nightly.ticks_within(at("2024-10-26T12:00:00Z"), at("2024-10-28T12:00:00Z"), 10);
        assert_eq!(
            shown(&autumn),
            ["2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"]
        );
        // From the second pass of 02:10, the next is the next night's.
        assert_eq!(
            rfc3339(nightly.next_after(at("2024-10-27T01:10:00Z")).unwrap()),
            "2024-10-28T01:30:00Z"
        );
        assert_eq!(
            rfc3339(nightly.latest_until(at("2024-10-27T01:45:00Z")).unwrap()),
            "2024-10-27T00:30:00Z"
        );
        // 02:30 never shows on 31 March: it runs at 03:30 CEST (01:30Z),
        // the instant 02:30 CET would have been.
        let spring =
            nightly.ticks_within(at("2024-03-30T12:00:00Z"), at("2024-04-01T12:00:00Z"), 10);
        assert_eq!(
            shown(&spring),
            ["2024-03-31T01:30:00Z", "2024-04-01T00:30:00Z"]
        );
        assert_eq!(
            rfc3339(nightly.latest_until(at("2024-03-31T01:40:00Z")).unwrap()),
            "2024-03-31T01:30:00Z"
        );
        assert_eq!(
            rfc3339(nightly.next_after(at("2024-03-31T01:10:00Z")).unwrap()),
            "2024-03-31T01:30:00Z"
        );
        // Two skipped wall times: both run, in order, from before the
        // change and from between them.
        let twice = berlin("0 30,45 2 * * *");
        let spring = twice.ticks_within(at("2024-03-30T12:00:00Z"), at("2024-03-31T12:00:00Z"), 10);
        assert_eq!(
            shown(&spring),
            ["2024-03-31T01:30:00Z", "2024-03-31T01:45:00Z"]
        );
        // A skipped 02:00 is the change's own instant (03:00 CEST); a
        // skipped 02:30 that lands on a real 03:30 runs once.
        let two = berlin("0 0 2 * * *");
        assert_eq!(
            rfc3339(two.next_after(at("2024-03-30T12:00:00Z")).unwrap()),
            "2024-03-31T01:00:00Z"
        );
        // A skipped wall time that is the expression's last tick still runs.
        let once = berlin("0 30 2 31 3 * 2024");
        assert_eq!(
            once.next_after(at("2024-03-30T12:00:00Z")).map(rfc3339),
            Some("2024-03-31T01:30:00Z".to_owned())
        );
        assert_eq!(once.next_after(at("2024-03-31T01:30:00Z")), None);
        let both = berlin("0 30 2,3 * * *");
        let spring = both.ticks_within(at("2024-03-30T12:00:00Z"), at("2024-03-31T12:00:00Z"), 10);
        assert_eq!(shown(&spring), ["2024-03-31T01:30:00Z"]);
        let every = berlin("0 * * * * *");
        let ticks =
            every.ticks_within(at("2024-03-31T00:30:00Z"), at("2024-03-31T01:30:00Z"), 1000);
        assert_eq!(ticks.len(), 61, "{:?}", shown(&ticks));
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 60 * SEC));
    }

    #[test]
    fn ticks_always_move_forward_through_a_year_of_a_zone_with_daylight_saving() {
        let quarter = berlin("0 */15 * * * *");
        let start = at("2024-01-01T00:00:00Z");
        let ticks = quarter.ticks_within(start, at("2025-01-01T00:00:00Z"), 40_000);
        // Every real quarter hour of 2024's 366 days, both ends included: the
        // skipped hour's wall times land on the next hour's ticks, the
        // repeated hour's tick twice.
        assert_eq!(ticks.len(), 366 * 96 + 1);
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 15 * 60 * SEC));
    }
}
