//! `select_overhead`: workflows of ten `keiro::select!`s of a no-op step
//! against an hour-long sleep, against workflows of ten plain no-op steps and
//! of none, interleaved in rounds like `seq_10steps`.

use std::time::Instant;

use keiro::Keiro;

use crate::common::{fail, round3, with_fresh_db, BenchResult, Config, Figure};
use crate::workflows::{bench_selects, bench_steps};

/// Workflows per series.
const WORKFLOWS: u32 = 200;
/// Rounds the series are interleaved in.
const ROUNDS: u32 = 10;
/// Selects (or steps) per workflow.
const PER_WORKFLOW: u32 = 10;

/// Runs `n` workflows one after another, of `count` selects (`select`) or
/// steps; returns the seconds it took.
async fn series(keiro: &Keiro, tag: &str, n: u32, count: u32, select: bool) -> BenchResult<f64> {
    let expected: u32 = (0..count).sum();
    let started = Instant::now();
    for i in 0..n {
        let id = format!("{tag}-{i}");
        let out = if select {
            bench_selects(count).id(id).on(keiro).await?
        } else {
            bench_steps(count).id(id).on(keiro).await?
        };
        if out != expected {
            return Err(fail(format!("{tag}: {count} returned {out}")));
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// `select_overhead`: `us/select` = (time of the select workflows - time of
/// empty ones) / selects, with the same figure for plain steps beside it.
pub(crate) async fn select_overhead(cfg: &Config) -> BenchResult {
    let (t0, t_steps, t_selects) = with_fresh_db(cfg.backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        series(&keiro, "warm", 20, PER_WORKFLOW, true).await?;
        let per_round = WORKFLOWS / ROUNDS;
        let (mut t0, mut t_steps, mut t_selects) = (0.0, 0.0, 0.0);
        for round in 0..ROUNDS {
            t0 += series(&keiro, &format!("e-{round}"), per_round, 0, false).await?;
            t_steps += series(
                &keiro,
                &format!("s-{round}"),
                per_round,
                PER_WORKFLOW,
                false,
            )
            .await?;
            t_selects +=
                series(&keiro, &format!("x-{round}"), per_round, PER_WORKFLOW, true).await?;
        }
        keiro.store().close().await;
        Ok((t0, t_steps, t_selects))
    })
    .await?;
    let waits = f64::from(WORKFLOWS * PER_WORKFLOW);
    let us_per_select = (t_selects - t0) * 1e6 / waits;
    let us_per_step = (t_steps - t0) * 1e6 / waits;
    cfg.emit(
        Figure::new("select_overhead", us_per_select, "us/select")
            .with(
                "how",
                "(time of 200 wf x 10 selects of a step vs a 1 h sleep - time of 200 wf x 0 steps) / 2000",
            )
            .with("us_per_step_interleaved", round3(us_per_step))
            .with("ratio_to_step", round3(us_per_select / us_per_step)),
    );
    Ok(())
}
