//! `pgbouncer`: `seq_10steps` and `concurrent_3steps` through a pgbouncer in
//! transaction pooling mode, next to the same series on a direct connection
//! in the same run (PostgreSQL only).
//!
//! The direct series run first: once a store opens with
//! `pooler=transaction`, every PostgreSQL store of the process prepares its
//! statements unnamed, so this workload runs last in a full run.

use std::time::Instant;

use keiro::Keiro;
use keiro_test_support::{PgBouncer, PostgresServer};

use crate::common::{fail, round3, with_fresh_db, BenchResult, Config, Figure, POSTGRES_URL_ENV};
use crate::throughput::concurrent_3steps;
use crate::workflows::bench_steps;

/// Workflows per sequential series.
const SEQ_WORKFLOWS: u32 = 200;
/// Workflows of the concurrent series.
const CONCURRENT_WORKFLOWS: u32 = 1_000;
/// Unmeasured workflows first.
const WARMUP: u32 = 20;

/// Seconds for `n` workflows of `steps` no-op steps, one after another.
async fn series(keiro: &Keiro, tag: &str, n: u32, steps: u32) -> BenchResult<f64> {
    let expected: u32 = (0..steps).sum();
    let started = Instant::now();
    for i in 0..n {
        let out = bench_steps(steps)
            .id(format!("{tag}-{i}"))
            .on(keiro)
            .await?;
        if out != expected {
            return Err(fail(format!("bench_steps({steps}) returned {out}")));
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Per-step microseconds (`(t10 - t1) / 9` per workflow) and concurrent
/// workflows per second on `url`.
async fn measure(cfg: &Config, url: &str, tag: &str) -> BenchResult<(f64, f64)> {
    let keiro = cfg.builder(url).connect().await?;
    series(&keiro, &format!("{tag}-warm"), WARMUP, 10).await?;
    let t1 = series(&keiro, &format!("{tag}-s1"), SEQ_WORKFLOWS, 1).await?;
    let t10 = series(&keiro, &format!("{tag}-s10"), SEQ_WORKFLOWS, 10).await?;
    let started = Instant::now();
    let done =
        concurrent_3steps(&keiro, &format!("{tag}-c"), CONCURRENT_WORKFLOWS, || false).await?;
    let secs = started.elapsed().as_secs_f64();
    keiro.shutdown().await?;
    let us_per_step = (t10 - t1) * 1e6 / (f64::from(SEQ_WORKFLOWS) * 9.0);
    Ok((us_per_step, f64::from(done) / secs))
}

/// The `pgbouncer` workload.
pub(crate) async fn pgbouncer(cfg: &Config) -> BenchResult {
    let server = PostgresServer::from_env(POSTGRES_URL_ENV);
    let bouncer = PgBouncer::start(server.url()).map_err(fail)?;
    let (direct, pooled) = with_fresh_db(cfg.backend, |db| async move {
        let direct = measure(cfg, &db.url, "direct").await?;
        let name = db
            .url
            .rsplit('/')
            .next()
            .and_then(|tail| tail.split('?').next())
            .ok_or_else(|| fail("no database in the bench URL"))?
            .to_owned();
        let pooled = measure(cfg, &bouncer.url(&name), "pooled").await?;
        Ok((direct, pooled))
    })
    .await?;
    let how = "through pgbouncer 1.18, pool_mode = transaction, pooler=transaction, no \
               listen_url; the direct series ran first in the same process";
    cfg.emit(
        Figure::new("seq_10steps_pgbouncer", pooled.0, "us/step")
            .with("direct_us_per_step", round3(direct.0))
            .with("ratio_to_direct", round3(pooled.0 / direct.0))
            .with("how", how),
    );
    cfg.emit(
        Figure::new("concurrent_3steps_pgbouncer", pooled.1, "wf/s")
            .with("direct_wf_per_s", round3(direct.1))
            .with("ratio_to_direct", round3(pooled.1 / direct.1))
            .with("workflows", CONCURRENT_WORKFLOWS)
            .with("how", how),
    );
    Ok(())
}
