//! `cron_lag`: a cron tick falls due, and the first step of the instance
//! it starts begins. A dynamic schedule ticking every second (dynamic, so no
//! other workload of this binary ticks) runs a probe whose first step
//! returns the wall clock as its body starts; the lag is that minus the tick
//! time, read from the instance id (`cron:<schedule>:<tick, RFC 3339>`). One
//! process: its scheduler sleeps until the tick (store clock), creates the
//! instance under its own lease and drives it at once, with no claim and no
//! resume pass in between.

use std::time::Duration;

use keiro::{ListFilter, ResumeOptions};

use crate::common::{fail, percentile, with_fresh_db, BenchResult, Config, Figure};
use crate::workflows::cron_probe;

/// Measured ticks.
const SAMPLES: usize = 30;
/// Unmeasured ticks first (the first may fall while the worker starts).
const WARMUP: usize = 2;
/// The schedule's name, and so its ids' prefix.
const SCHEDULE: &str = "cron_lag";

/// Runs the workload and prints p50 and p99 in ms.
pub(crate) async fn cron_lag(cfg: &Config) -> BenchResult {
    let samples = with_fresh_db(cfg.backend, |db| async move { lags(cfg, &db.url).await }).await?;
    for (stat, p) in [("p50", 50.0), ("p99", 99.0)] {
        cfg.emit(
            Figure::new("cron_lag", percentile(&samples, p), "ms")
                .with("stat", stat)
                .with("samples", samples.len())
                .with(
                    "what",
                    "tick time of a `*/1 * * * * *` schedule until its instance's first step \
                     starts; the scheduler beside one resume worker creates the instance \
                     under its lease and drives it at once",
                ),
        );
    }
    Ok(())
}

async fn lags(cfg: &Config, url: &str) -> BenchResult<Vec<f64>> {
    let keiro = cfg.builder(url).connect().await?;
    let worker = keiro.resume_worker(ResumeOptions::default()).await?;
    keiro
        .create_schedule(SCHEDULE, "*/1 * * * * *", cron_probe())
        .await?;
    tokio::time::sleep(Duration::from_secs((SAMPLES + WARMUP + 1) as u64)).await;
    keiro.delete_schedule(SCHEDULE).await?;
    let prefix = format!("cron:{SCHEDULE}:");
    let page = keiro
        .list(&ListFilter::default().id_prefix(&prefix).limit(1000))
        .await?;
    let mut ids: Vec<String> = page.items.into_iter().map(|row| row.id).collect();
    ids.sort();
    let mut lags = Vec::new();
    for id in ids.iter().skip(WARMUP).take(SAMPLES) {
        let tick = id
            .strip_prefix(&prefix)
            .and_then(|tick| chrono::DateTime::parse_from_rfc3339(tick).ok())
            .ok_or_else(|| fail(format!("instance id `{id}` holds no tick time")))?
            .timestamp_micros();
        let started: i64 = keiro.handle(id.as_str()).await?.result().await?;
        lags.push((started - tick) as f64 / 1_000.0);
    }
    worker.shutdown().await;
    if lags.len() < SAMPLES {
        return Err(fail(format!(
            "only {} of {SAMPLES} ticks ran: {ids:?}",
            lags.len()
        )));
    }
    Ok(lags)
}
