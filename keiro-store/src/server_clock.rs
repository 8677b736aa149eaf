//! The database server's clock, read against this process's system clock:
//! how a worker on PostgreSQL learns whether its own clock is off (workers
//! compare lease and wake times by their own clocks, so they must agree).

use crate::{Result, Store};

/// How many times [`Store::read_server_clock`] reads the server's clock; it
/// keeps the reading with the shortest round trip.
#[cfg(feature = "postgres")]
const READINGS: usize = 3;

/// One reading of the database server's clock against this process's
/// system clock ([`Store::read_server_clock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    /// This process's clock minus the server's, in µs: positive when this
    /// process's clock runs ahead of the server's, negative when behind.
    pub offset_us: i64,
    /// Half the round trip of the reading, in µs: the true offset lies
    /// within `offset_us ± uncertainty_us`.
    pub uncertainty_us: i64,
}

impl ClockReading {
    /// How far this process's clock is off for certain: the offset less
    /// the reading's uncertainty, and 0 when the uncertainty covers it.
    pub fn certain_skew_us(&self) -> i64 {
        (self.offset_us.abs() - self.uncertainty_us).max(0)
    }
}

impl Store {
    /// Reads the database server's clock against this process's system
    /// clock (never a manual [`crate::Clock`]): on PostgreSQL, the best of
    /// three readings of `clock_timestamp()`, each placed at the midpoint of
    /// its round trip. `None` on SQLite: the database is a file on this
    /// host, read by this host's clock, so there is no second clock to
    /// disagree with.
    pub async fn read_server_clock(&self) -> Result<Option<ClockReading>> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => Ok(None),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let mut best: Option<ClockReading> = None;
                for _ in 0..READINGS {
                    let reading = read_once(s).await?;
                    if best.is_none_or(|b| reading.uncertainty_us < b.uncertainty_us) {
                        best = Some(reading);
                    }
                }
                Ok(best)
            }
        }
    }
}

/// One reading of PostgreSQL's clock, placed at the midpoint of its round
/// trip.
#[cfg(feature = "postgres")]
async fn read_once(s: &crate::PostgresStore) -> Result<ClockReading> {
    // The round trip timed by the monotonic clock: a step of the wall clock
    // meanwhile (NTP) cannot make it negative.
    let (before, sent) = (crate::now_us(), std::time::Instant::now());
    let server: i64 = crate::prepared::query_scalar(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
    )
    .fetch_one(s.exec())
    .await
    .map_err(crate::StoreError::query("read_server_clock"))?;
    let round_trip = i64::try_from(sent.elapsed().as_micros()).unwrap_or(i64::MAX);
    Ok(ClockReading {
        offset_us: before.saturating_add(round_trip / 2) - server,
        uncertainty_us: round_trip / 2 + 1,
    })
}

#[cfg(test)]
mod tests {
    use super::ClockReading;

    #[test]
    fn the_certain_skew_gives_the_reading_the_benefit_of_its_uncertainty() {
        let reading = |offset_us, uncertainty_us| ClockReading {
            offset_us,
            uncertainty_us,
        };
        assert_eq!(reading(5_000_000, 1_000).certain_skew_us(), 4_999_000);
        assert_eq!(reading(-5_000_000, 1_000).certain_skew_us(), 4_999_000);
        assert_eq!(reading(800, 1_000).certain_skew_us(), 0);
        assert_eq!(reading(-800, 1_000).certain_skew_us(), 0);
    }
}
