//! `list_page`: one 50-row page of `keiro.list` filtered by status, out of
//! 1,000,000 instances (5% failed, the rest completed, running or
//! suspended, ten workflow names), bulk-inserted with one SQL statement. It
//! times the first page of the failed ones, a page 25,000 rows deep into
//! them (reached by following cursors), and the first page of a two-status
//! filter (failed or running); each is the median of several runs.

use std::time::Instant;

use keiro::{Keiro, ListFilter, WorkflowStatus};

use crate::common::{
    count, execute, fail, median, round3, tables, with_fresh_db, Backend, BenchResult, Config,
    Figure,
};

/// Instances inserted.
const INSTANCES: i64 = 1_000_000;
/// Rows per measured page.
const PAGE: u32 = 50;
/// How deep into the failed instances the deep page starts.
const DEEP: u32 = 25_000;
/// Runs per figure (the median is reported).
const RUNS: usize = 9;

/// The `list_page` workload.
pub(crate) async fn list_page(cfg: &Config) -> BenchResult {
    with_fresh_db(cfg.backend, |db| async move {
        let keiro = cfg.builder(&db.url).connect().await?;
        let started = Instant::now();
        fill(&keiro, cfg.backend).await?;
        let insert_s = started.elapsed().as_secs_f64();
        let failed = ListFilter::default()
            .status(WorkflowStatus::Failed)
            .limit(PAGE);
        let first = time_page(&keiro, &failed).await?;
        let deep = time_page(
            &keiro,
            &failed.clone().cursor(cursor_at(&keiro, DEEP).await?),
        )
        .await?;
        let two = ListFilter::default()
            .status(WorkflowStatus::Failed)
            .status(WorkflowStatus::Running)
            .limit(PAGE);
        let two_first = time_page(&keiro, &two).await?;
        let figures = [
            (first, "first", "failed"),
            (deep, "25,000 rows deep, from a cursor", "failed"),
            (two_first, "first", "failed,running"),
        ];
        for (ms, page, statuses) in figures {
            cfg.emit(
                Figure::new("list_page", round3(ms), "ms")
                    .with("instances", INSTANCES)
                    .with("rows", PAGE)
                    .with("statuses", statuses)
                    .with("page", page)
                    .with("runs", RUNS as u64)
                    .with("bulk_insert_s", round3(insert_s)),
            );
        }
        Ok(())
    })
    .await
}

/// Inserts the instances with one statement (plus statistics for the
/// planner, as autovacuum or `ANALYZE` would gather them).
async fn fill(keiro: &Keiro, backend: Backend) -> BenchResult {
    let store = keiro::unstable::raw_store(keiro);
    let (workflows, _) = tables(backend);
    // Times 1 µs apart, from a day ago; statuses by residue: 5% failed.
    let base = crate::common::now_us() - 86_400_000_000;
    let row = |i: &str| {
        format!(
            "'list-' || {i}, 'wf-' || ({i} % 10), 0, \
             CASE {i} % 20 WHEN 0 THEN 'failed' WHEN 1 THEN 'running' \
             WHEN 2 THEN 'suspended' ELSE 'completed' END, \
             '[]', 0, {base} + {i}, {base} + {i}"
        )
    };
    let columns = "id, name, generation, status, input, attempts, created_at, updated_at";
    let (insert, analyze) = match backend {
        Backend::Sqlite => (
            format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n \
                 WHERE i < {INSTANCES}) \
                 INSERT INTO {workflows} ({columns}) SELECT {} FROM n",
                row("i")
            ),
            "ANALYZE".to_owned(),
        ),
        Backend::Postgres => (
            format!(
                "INSERT INTO {workflows} ({columns}) SELECT {} \
                 FROM generate_series(1, {INSTANCES}) g",
                row("g")
            ),
            format!("ANALYZE {workflows}"),
        ),
    };
    let inserted = execute(store, &insert).await?;
    if inserted != INSTANCES as u64 {
        return Err(fail(format!(
            "inserted {inserted} instances, not {INSTANCES}"
        )));
    }
    execute(store, &analyze).await?;
    let failed = count(
        store,
        &format!("SELECT count(*) FROM {workflows} WHERE status = 'failed'"),
    )
    .await?;
    if failed != INSTANCES / 20 {
        return Err(fail(format!(
            "{failed} failed instances, not {}",
            INSTANCES / 20
        )));
    }
    Ok(())
}

/// The cursor after the first `depth` failed instances, newest first.
async fn cursor_at(keiro: &Keiro, depth: u32) -> BenchResult<String> {
    let mut filter = ListFilter::default()
        .status(WorkflowStatus::Failed)
        .limit(keiro::MAX_PAGE);
    let mut seen = 0;
    loop {
        let page = keiro.list(&filter).await?;
        seen += page.items.len() as u32;
        let cursor = page
            .next_cursor
            .ok_or_else(|| fail(format!("the failed instances end before {depth} rows")))?;
        if seen >= depth {
            return Ok(cursor);
        }
        filter = filter.cursor(cursor);
    }
}

/// The median time of one page of `filter`, in ms, after a warm-up run.
async fn time_page(keiro: &Keiro, filter: &ListFilter) -> BenchResult<f64> {
    let mut samples = Vec::with_capacity(RUNS);
    for run in 0..=RUNS {
        let started = Instant::now();
        let page = keiro.list(filter).await?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if page.items.len() != PAGE as usize {
            return Err(fail(format!(
                "a page held {} rows, not {PAGE}",
                page.items.len()
            )));
        }
        if run > 0 {
            samples.push(ms);
        }
    }
    Ok(median(&samples))
}
