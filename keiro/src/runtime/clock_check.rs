//! Whether this process's clock agrees with the database server's.
//!
//! Workers compare lease expiries and wake times by their own clocks, so a
//! worker whose clock runs ahead takes live instances' leases and one whose
//! clock runs behind has its own taken; either way a step body runs twice.
//! On PostgreSQL a process reads the server's clock when it takes its
//! executor identity (and is refused beyond `max_clock_skew`), then at every
//! heartbeat; while its clock is off its resume passes claim nothing and its
//! cron scheduler starts no tick. Between readings, a step of this process's
//! wall clock (an operator, NTP stepping it) shows at once: measured against
//! a clock no one sets ([`steady_us`]), it moves the last reading's offset.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro_store::{now_us, ClockReading, Store};

use crate::{Error, Keiro, Result};

/// What one reading says of this process's clock.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No second clock (SQLite), a manual clock, or within the limit.
    Within,
    /// Off by more than the limit: this process's clock minus the
    /// server's, in µs.
    Off(i64),
}

/// Judges `reading` against `limit`, giving it the benefit of its
/// uncertainty.
pub(crate) fn judge(reading: Option<ClockReading>, limit: Duration) -> Verdict {
    let limit_us = i64::try_from(limit.as_micros()).unwrap_or(i64::MAX);
    match reading {
        Some(reading) if reading.certain_skew_us() > limit_us => Verdict::Off(reading.offset_us),
        _ => Verdict::Within,
    }
}

/// The last reading of the server's clock, with this process's wall clock
/// and [`steady_us`] when it was taken.
#[derive(Debug, Default)]
struct LastReading(Mutex<Option<(ClockReading, i64, i64)>>);

impl LastReading {
    /// Keeps `reading`, taken just now.
    fn record(&self, reading: ClockReading) {
        *crate::runtime::lock(&self.0) = Some((reading, now_us(), steady_us()));
    }

    /// The offset now, as far as this process can tell without reading the
    /// server's clock again: the last reading's, moved by however far the
    /// wall clock moved apart from [`steady_us`] since. `None` before any
    /// reading.
    fn estimate(&self) -> Option<ClockReading> {
        let (reading, wall, steady) = (*crate::runtime::lock(&self.0))?;
        let elapsed = steady_us().saturating_sub(steady);
        let step = now_us().saturating_sub(wall).saturating_sub(elapsed);
        Some(ClockReading {
            offset_us: reading.offset_us.saturating_add(step),
            uncertainty_us: reading.uncertainty_us,
        })
    }
}

/// A standing verdict on this process's clock against the server's, kept
/// by the runtime (read at each heartbeat) and by each timer worker loop.
#[derive(Debug)]
pub(crate) struct ClockVerdict {
    limit: Duration,
    /// The offset (µs) at the last reading that found the clock off; 0
    /// while within (an offset beyond any limit is never 0).
    off_us: AtomicI64,
    last: LastReading,
}

/// How the standing verdict changed with a reading ([`ClockVerdict::keep`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// It went off, by this offset (µs).
    WentOff(i64),
    /// It came back within the limit.
    CameBack,
    /// As it was.
    Unchanged,
}

impl ClockVerdict {
    /// A verdict allowing `limit`, within until a reading says otherwise.
    pub(crate) fn new(limit: Duration) -> ClockVerdict {
        ClockVerdict {
            limit,
            off_us: AtomicI64::new(0),
            last: LastReading::default(),
        }
    }

    /// The skew allowed.
    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Reads the server's clock (a store on a manual clock is not checked)
    /// and judges this process's against it, keeping the reading for
    /// [`ClockVerdict::off_by`]'s estimate; the standing verdict is left to
    /// [`ClockVerdict::keep`].
    pub(crate) async fn read(&self, store: &Store) -> keiro_store::Result<Verdict> {
        if store.clock().is_manual() {
            return Ok(Verdict::Within);
        }
        let reading = store.read_server_clock().await?;
        if let Some(reading) = reading {
            crate::telemetry::clock_offset(reading.offset_us);
            self.last.record(reading);
        }
        Ok(judge(reading, self.limit))
    }

    /// Makes `verdict` the standing one; how that changed it.
    pub(crate) fn keep(&self, verdict: &Verdict) -> Change {
        let now_off = match verdict {
            Verdict::Within => 0,
            Verdict::Off(offset_us) => *offset_us,
        };
        match (self.off_us.swap(now_off, Ordering::SeqCst), now_off) {
            (0, 0) => Change::Unchanged,
            (0, off) => Change::WentOff(off),
            (_, 0) => Change::CameBack,
            _ => Change::Unchanged,
        }
    }

    /// How far the clock is off the server's (µs) when it is beyond the
    /// limit: as the last kept verdict says, or as a step of the wall clock
    /// since the last reading has put it (until the next reading says).
    pub(crate) fn off_by(&self) -> Option<i64> {
        match self.off_us.load(Ordering::SeqCst) {
            0 => match judge(self.last.estimate(), self.limit) {
                Verdict::Within => None,
                Verdict::Off(offset_us) => Some(offset_us),
            },
            off => Some(off),
        }
    }
}

/// A clock no one sets, in µs from an arbitrary start: Linux's
/// (and Android's) `CLOCK_BOOTTIME`, which goes on counting while the machine is suspended
/// (as the wall clock does once it resumes, so a suspend is no step), and
/// the monotonic clock elsewhere. NTP slews it as it slews the wall clock.
fn steady_us() -> i64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let at = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Duration::try_from(at).map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let start = *START.get_or_init(std::time::Instant::now);
        i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX)
    }
}

impl Keiro {
    /// Reads the server's clock and judges this process's against it.
    async fn read_clock_verdict(&self) -> Result<Verdict> {
        Ok(self.inner.clock.read(self.raw_store()).await?)
    }

    /// Refuses to take an executor identity with a clock that is off.
    pub(crate) async fn check_clock_at_start(&self, executor: &str) -> Result<()> {
        match self.read_clock_verdict().await? {
            Verdict::Within => Ok(()),
            Verdict::Off(offset_us) => Err(self.clock_skew_error(executor, offset_us)),
        }
    }

    /// Reads the server's clock again (at a heartbeat), keeping the verdict
    /// for [`Keiro::refuse_claims_if_clock_off`] and logging when it
    /// changes. A failed reading leaves the last verdict standing.
    pub(crate) async fn recheck_clock(&self, executor: &str) {
        let verdict = match self.read_clock_verdict().await {
            Ok(verdict) => verdict,
            Err(error) => {
                // The heartbeat beside it has said the database is unreachable.
                tracing::debug!(%error, "keiro could not read the database server's clock");
                return;
            }
        };
        match self.inner.clock.keep(&verdict) {
            Change::WentOff(off) => {
                let error = self.clock_skew_error(executor, off);
                tracing::error!(%error, "keiro stops claiming work");
            }
            Change::CameBack => tracing::info!(
                executor,
                "keiro: this process's clock is back within max_clock_skew of the database \
                 server's; its resume worker claims work and its cron scheduler starts ticks again"
            ),
            // Still off: said when it went off.
            Change::Unchanged => {}
        }
    }

    /// How far this process's clock may be off the database server's
    /// (`KeiroBuilder::max_clock_skew`).
    pub(crate) fn max_clock_skew(&self) -> Duration {
        self.inner.clock.limit()
    }

    /// The verdict on the clock shared by this runtime's timers.
    pub(crate) fn timer_clock(&self) -> Arc<crate::timers::ClockGuard> {
        self.inner.timer_clock.clone()
    }

    /// Whether this process's clock is off ([`ClockVerdict::off_by`]): it
    /// claims nothing then (no pass, refill or hand-over) and starts no cron
    /// tick.
    pub(crate) fn clock_is_off(&self) -> bool {
        self.inner.clock.off_by().is_some()
    }

    /// `Err(ClockSkew)` while this process's clock is off: a resume pass
    /// claims nothing then.
    pub(crate) fn refuse_claims_if_clock_off(&self) -> Result<()> {
        match self.inner.clock.off_by() {
            None => Ok(()),
            Some(off) => Err(self.clock_skew_error(self.owner(), off)),
        }
    }

    fn clock_skew_error(&self, executor: &str, offset_us: i64) -> Error {
        Error::ClockSkew {
            executor: executor.to_owned(),
            offset_ms: offset_us / 1000,
            limit: self.max_clock_skew(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(offset_us: i64, uncertainty_us: i64) -> Option<ClockReading> {
        Some(ClockReading {
            offset_us,
            uncertainty_us,
        })
    }

    #[test]
    fn a_clock_is_off_only_when_it_is_certainly_beyond_the_limit() {
        let limit = Duration::from_millis(2_500);
        assert_eq!(judge(None, limit), Verdict::Within, "no second clock");
        assert_eq!(judge(reading(2_400_000, 50_000), limit), Verdict::Within);
        assert_eq!(
            judge(reading(2_540_000, 50_000), limit),
            Verdict::Within,
            "the uncertainty may cover the excess"
        );
        assert_eq!(
            judge(reading(2_600_000, 50_000), limit),
            Verdict::Off(2_600_000)
        );
        assert_eq!(
            judge(reading(-30_000_000, 1_000), limit),
            Verdict::Off(-30_000_000),
            "behind counts as much as ahead"
        );
        assert_eq!(
            judge(reading(-30_000_000, 1_000), Duration::MAX),
            Verdict::Within,
            "Duration::MAX turns the check off"
        );
    }
}
