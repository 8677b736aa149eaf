//! The workload of the fault tests: a workflow of checked steps whose bodies
//! record, on entry, whether their own result was already journaled, and the
//! worker process (`fault_worker`) that runs it.
//!
//! Every step body appends `<id> <n> <pid> fresh|JOURNALED` to a side-effect
//! log before doing anything else. `JOURNALED` means a body started although
//! its result was already in the journal: the one thing keiro promises never
//! happens. A body may run more than once (`fresh` twice) only when the
//! process died or lost the database before its result was journaled.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::Duration;

use keiro::{step, workflow, Keiro, ResumeOptions};

use crate::workflows::append_line;

/// The environment variable giving the fault worker's lease TTL in
/// milliseconds (the builder's default when unset).
pub const LEASE_MS_ENV: &str = "KEIRO_FAULT_LEASE_MS";

/// The environment variable that, when set (to a `tracing` filter such as
/// `keiro=debug`), makes fault workers log to stderr: for diagnosing a
/// failing fault test.
pub const LOG_ENV: &str = "KEIRO_FAULT_LOG";

/// How long a step body keeps retrying its journal check while the database
/// is unreachable before it gives up (and panics: a crash, retried later).
const CHECK_PATIENCE: Duration = Duration::from_secs(60);

/// How many `step` rows the journal of instance `id` holds, read through a
/// connection of the process-wide runtime's pool (not the writer's), retried
/// while the database is unreachable.
async fn journaled_steps(id: &str) -> usize {
    let deadline = tokio::time::Instant::now() + CHECK_PATIENCE;
    loop {
        match count_steps(id).await {
            Ok(count) => return count,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("journal check of {id} failed for {CHECK_PATIENCE:?}: {error}"),
        }
    }
}

async fn count_steps(id: &str) -> Result<usize, keiro::Error> {
    let keiro = keiro::global().await?;
    let store = keiro.store();
    let Some(instance) = store.get_instance(id).await? else {
        return Ok(0);
    };
    let journal = store.load_journal(id, instance.generation).await?;
    Ok(journal.iter().filter(|row| row.kind == "step").count())
}

/// Step `n` of workflow `id`: logs on entry whether its result was already
/// journaled, then waits `pause_ms`. Returns the id of the process that ran
/// it, so the journal tells whose run each result came from.
#[step]
pub async fn checked_step(id: String, n: u32, log: String, pause_ms: u64) -> String {
    let existed = journaled_steps(&id).await >= n as usize;
    let pid = std::process::id();
    let state = if existed { "JOURNALED" } else { "fresh" };
    append_line(&log, &format!("{id} {n} {pid} {state}"));
    if pause_ms > 0 {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    }
    pid.to_string()
}

/// `steps` checked steps in a row; returns each step's result (the pid that
/// ran it).
#[workflow]
pub async fn checked_steps(id: String, steps: u32, log: String, pause_ms: u64) -> Vec<String> {
    let mut out = Vec::with_capacity(steps as usize);
    for n in 1..=steps {
        out.push(checked_step(id.clone(), n, log.clone(), pause_ms).await);
    }
    out
}

/// One line of the side-effect log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepEntry {
    /// The workflow id.
    pub id: String,
    /// The step number (1-based).
    pub n: u32,
    /// The process that ran the body.
    pub pid: String,
    /// Whether the body found its result already journaled.
    pub journaled: bool,
    /// The line's position in the log.
    pub line: usize,
}

/// The step entries of a side-effect log; other lines (markers a test
/// writes, such as `PARTITION`) are skipped but keep their line numbers.
pub fn step_entries(log: &std::path::Path) -> Vec<StepEntry> {
    crate::process::lines_of(log)
        .iter()
        .enumerate()
        .filter_map(|(line, text)| {
            let parts: Vec<&str> = text.split_whitespace().collect();
            match parts.as_slice() {
                [id, n, pid, state] => Some(StepEntry {
                    id: (*id).to_owned(),
                    n: n.parse().ok()?,
                    pid: (*pid).to_owned(),
                    journaled: *state == "JOURNALED",
                    line,
                }),
                _ => None,
            }
        })
        .collect()
}

/// Asserts that no step body started after its result was journaled and that
/// each of `ids`' `steps` steps ran at least once; returns how many bodies
/// ran more than once (allowed: their result was not yet journaled).
pub fn assert_no_journaled_step_ran_again(
    log: &std::path::Path,
    ids: &[String],
    steps: u32,
) -> usize {
    let entries = step_entries(log);
    let again: Vec<&StepEntry> = entries.iter().filter(|e| e.journaled).collect();
    assert!(
        again.is_empty(),
        "{} step bodies started after their result was journaled, e.g. {:?}",
        again.len(),
        &again[..again.len().min(5)]
    );
    let mut runs: HashMap<(&str, u32), usize> = HashMap::new();
    for entry in &entries {
        *runs.entry((entry.id.as_str(), entry.n)).or_default() += 1;
    }
    for id in ids {
        for n in 1..=steps {
            assert!(
                runs.contains_key(&(id.as_str(), n)),
                "step {n} of workflow {id} never ran"
            );
        }
    }
    runs.values().filter(|&&count| count > 1).count()
}

/// How many instances are in each status (`completed`, `running`, …), read
/// through the pool of `keiro`'s store.
pub async fn status_counts(keiro: &Keiro) -> Result<BTreeMap<String, i64>, sqlx::Error> {
    let store = keiro.store();
    let rows: Vec<(String, i64)> = if let Some(pool) = store.postgres_pool() {
        sqlx::query_as("SELECT status, count(*) FROM keiro.workflows GROUP BY status")
            .fetch_all(pool)
            .await?
    } else {
        let pool = store.sqlite_pool().expect("a SQLite or PostgreSQL store");
        sqlx::query_as("SELECT status, count(*) FROM keiro_workflows GROUP BY status")
            .fetch_all(pool)
            .await?
    };
    Ok(rows.into_iter().collect())
}

/// Waits until `expected` instances are completed (or `limit` passes,
/// then panics with the counts), polling through database errors.
pub async fn wait_all_completed(keiro: &Keiro, expected: usize, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let last = match status_counts(keiro).await {
            Ok(counts) => {
                if counts.get("completed").copied().unwrap_or(0) as usize == expected
                    && counts.len() == 1
                {
                    return;
                }
                format!("{counts:?}")
            }
            Err(error) => format!("error: {error}"),
        };
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "not every one of {expected} workflows completed within {limit:?}; last: {last}; \
                 the database's sessions: {}",
                sessions(keiro).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What each of the database's other sessions (PostgreSQL) is doing, for a
/// failing test's message: a session idle in a transaction, or one waiting
/// on a lock, is the usual reason workers stop making progress.
async fn sessions(keiro: &Keiro) -> String {
    let Some(pool) = keiro.store().postgres_pool() else {
        return "(SQLite: one writer at a time)".to_owned();
    };
    type Session = (Option<String>, Option<String>, Option<String>);
    let sessions: Result<Vec<Session>, _> = sqlx::query_as(
        "SELECT state, wait_event, left(query, 120) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(pool)
    .await;
    match sessions {
        Ok(sessions) => format!("{sessions:?}"),
        Err(error) => format!("(unreadable: {error})"),
    }
}

/// Every journal row as `(workflow id, seq, JSON result)`, ordered by id and
/// seq.
pub async fn journal_results(keiro: &Keiro) -> Result<Vec<(String, i64, String)>, sqlx::Error> {
    let store = keiro.store();
    if let Some(pool) = store.postgres_pool() {
        sqlx::query_as("SELECT workflow_id, seq, result FROM keiro.steps ORDER BY workflow_id, seq")
            .fetch_all(pool)
            .await
    } else {
        let pool = store.sqlite_pool().expect("a SQLite or PostgreSQL store");
        sqlx::query_as("SELECT workflow_id, seq, result FROM keiro_steps ORDER BY workflow_id, seq")
            .fetch_all(pool)
            .await
    }
}

/// The body of the `fault_worker` binary: connects to `KEIRO_DATABASE_URL`
/// under `KEIRO_EXECUTOR_ID` with the lease [`LEASE_MS_ENV`] gives, installs
/// it as the process-wide runtime, logs to stderr when [`LOG_ENV`] is set,
/// starts the resume worker (50 ms poll),
/// prints `READY` and runs until killed.
pub async fn run_fault_worker() {
    if let Ok(filter) = std::env::var(LOG_ENV) {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let url = std::env::var("KEIRO_DATABASE_URL").expect("KEIRO_DATABASE_URL");
    let mut builder = Keiro::builder(&url);
    if let Some(ms) = std::env::var(LEASE_MS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder = builder.lease_ttl(Duration::from_millis(ms));
    }
    let keiro = builder
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    keiro::init(keiro.clone()).expect("install the runtime");
    let _worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap_or_else(|e| panic!("start the resume worker: {e}"));
    println!("READY");
    std::io::stdout().flush().ok();
    std::future::pending::<()>().await;
}

/// A running `fault_worker` process, SIGKILLed when dropped.
#[derive(Debug)]
pub struct FaultWorker {
    child: tokio::process::Child,
}

impl FaultWorker {
    /// Starts `binary` (the `fault_worker` bin) on `url` under `executor`,
    /// with a lease of `lease` when given, and waits (60 s at most) for it to
    /// print `READY`.
    pub async fn start(
        binary: &str,
        url: &str,
        executor: &str,
        lease: Option<Duration>,
    ) -> FaultWorker {
        use tokio::io::AsyncBufReadExt;
        let mut command = tokio::process::Command::new(binary);
        command
            .env("KEIRO_DATABASE_URL", url)
            .env("KEIRO_EXECUTOR_ID", executor)
            .env_remove(LEASE_MS_ENV)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(lease) = lease {
            command.env(LEASE_MS_ENV, lease.as_millis().to_string());
        }
        let mut child = command.spawn().expect("start the fault_worker process");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the fault worker is ready within 60 s")
            .expect("read the fault worker's stdout");
        assert_eq!(
            ready.as_deref(),
            Some("READY"),
            "fault worker {executor} did not start"
        );
        FaultWorker { child }
    }

    /// The process id (as the steps it runs record it).
    pub fn pid(&self) -> String {
        self.child.id().expect("the worker is running").to_string()
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        self.child
            .try_wait()
            .expect("poll the fault worker")
            .is_none()
    }

    /// SIGKILLs the process and reaps it.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL the fault worker");
        self.child.wait().await.expect("reap the fault worker");
    }
}

/// Makes PostgreSQL refuse, once, the first update that sets a workflow's
/// status to `status`, with a deadlock (SQLSTATE `40P01`): a stand-in for
/// two transactions that locked the same rows in opposite orders. Returns
/// a reader of how many times the trigger fired (counted by a sequence, so
/// the refused firing counts though its transaction rolled back).
pub async fn deadlock_once_on_status(pool: &sqlx::PgPool, status: &str) -> DeadlockOnce {
    assert!(
        status.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
        "a status name, not {status:?}"
    );
    sqlx::raw_sql(&format!(
        "CREATE SEQUENCE deadlock_once; \
         CREATE FUNCTION deadlock_once() RETURNS trigger AS $$ BEGIN \
         IF NEW.status = '{status}' AND nextval('deadlock_once') = 1 THEN \
         RAISE EXCEPTION 'deadlock detected (a test trigger)' USING ERRCODE = '40P01'; \
         END IF; RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER deadlock_once BEFORE UPDATE ON keiro.workflows FOR EACH ROW \
         EXECUTE FUNCTION deadlock_once()"
    ))
    .execute(pool)
    .await
    .expect("install the deadlock trigger");
    DeadlockOnce { pool: pool.clone() }
}

/// The trigger [`deadlock_once_on_status`] installed.
pub struct DeadlockOnce {
    pool: sqlx::PgPool,
}

impl DeadlockOnce {
    /// How many times the trigger fired (the refused time included).
    pub async fn fired(&self) -> i64 {
        sqlx::query_scalar("SELECT last_value FROM deadlock_once")
            .fetch_one(&self.pool)
            .await
            .expect("read the deadlock trigger's count")
    }
}
