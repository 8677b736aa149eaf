//! What every workload shares: the backend and a fresh database per workload,
//! the JSON figure line, child processes of this binary, clocks, percentiles
//! and the resident set size.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro::{Keiro, KeiroBuilder, SqliteSynchronous};
use keiro_store::Store;
use keiro_store::StoreOptions;
use sqlx::Connection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout, Command};

/// Any error a workload can end with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A workload's result.
pub(crate) type BenchResult<T = ()> = Result<T, BoxError>;

/// The PostgreSQL server the benchmark creates its databases on.
pub(crate) const POSTGRES_URL_ENV: &str = "KEIRO_BENCH_POSTGRES_URL";
/// Used when [`POSTGRES_URL_ENV`] is unset: the local server over its Unix socket.
pub(crate) const DEFAULT_POSTGRES_URL: &str = "postgres:///keiro_test";

/// Builds an error from a message.
pub(crate) fn fail(message: impl Into<String>) -> BoxError {
    message.into().into()
}

/// The database backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// A fresh SQLite file in a temporary directory per workload.
    Sqlite,
    /// A fresh database on the PostgreSQL server per workload.
    Postgres,
}

impl Backend {
    /// The name printed in every figure.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// Parses `sqlite` or `postgres`.
    pub(crate) fn parse(text: &str) -> Option<Backend> {
        match text {
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            _ => None,
        }
    }
}

/// Parses `full` or `normal`.
pub(crate) fn parse_sync(text: &str) -> Option<SqliteSynchronous> {
    match text {
        "full" => Some(SqliteSynchronous::Full),
        "normal" => Some(SqliteSynchronous::Normal),
        _ => None,
    }
}

/// The name of a SQLite durability setting.
pub(crate) fn sync_name(sync: SqliteSynchronous) -> &'static str {
    match sync {
        SqliteSynchronous::Normal => "normal",
        _ => "full",
    }
}

/// What the run was asked for: the backend and the SQLite durability.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    /// The backend.
    pub(crate) backend: Backend,
    /// SQLite's `synchronous` setting (ignored on PostgreSQL).
    pub(crate) sync: SqliteSynchronous,
}

impl Config {
    /// The store options keiro uses with this configuration (default pool size).
    pub(crate) fn store_options(&self) -> StoreOptions {
        StoreOptions {
            sqlite_synchronous: self.sync,
            ..StoreOptions::default()
        }
    }

    /// A keiro builder for `url` with this durability and a fresh executor id.
    pub(crate) fn builder(&self, url: &str) -> KeiroBuilder {
        builder(url, self.sync)
    }

    /// Prints one figure as a JSON line on stdout.
    pub(crate) fn emit(&self, figure: Figure) {
        let mut line = format!(
            "{{\"system\":\"keiro\",\"backend\":{},\"workload\":{},\"value\":{},\"unit\":{}",
            json_str(self.backend.name()),
            json_str(figure.workload),
            json_num(figure.value),
            json_str(&figure.unit),
        );
        if self.backend == Backend::Sqlite {
            line.push_str(&format!(",\"sync\":{}", json_str(sync_name(self.sync))));
        }
        for (key, value) in figure.extra {
            line.push_str(&format!(",{}:{}", json_str(key), value));
        }
        line.push('}');
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// A keiro builder for `url` with durability `sync` and a fresh executor id.
pub(crate) fn builder(url: &str, sync: SqliteSynchronous) -> KeiroBuilder {
    Keiro::builder(url)
        .sqlite_synchronous(sync)
        .executor_id(format!("bench-{}", uuid::Uuid::new_v4().simple()))
}

/// One measured figure.
#[derive(Debug)]
pub(crate) struct Figure {
    workload: &'static str,
    value: f64,
    unit: String,
    extra: Vec<(&'static str, serde_json::Value)>,
}

impl Figure {
    /// `value` `unit` for `workload`.
    pub(crate) fn new(workload: &'static str, value: f64, unit: impl Into<String>) -> Figure {
        Figure {
            workload,
            value,
            unit: unit.into(),
            extra: Vec::new(),
        }
    }

    /// Adds a field after the required ones.
    pub(crate) fn with(mut self, key: &'static str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.push((key, value.into()));
        self
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A number rounded to three decimals (integers stay integers).
fn json_num(v: f64) -> String {
    if !v.is_finite() {
        return "null".to_owned();
    }
    let rounded = (v * 1000.0).round() / 1000.0;
    if rounded.fract() == 0.0 && rounded.abs() < 1e15 {
        format!("{}", rounded as i64)
    } else {
        format!("{rounded}")
    }
}

/// Rounds to three decimals, for extra fields.
pub(crate) fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A fresh, empty database for one workload; [`BenchDb::drop_db`] removes it.
#[derive(Debug)]
pub(crate) struct BenchDb {
    /// The URL keiro connects to.
    pub(crate) url: String,
    /// The temporary directory of a SQLite database (also a scratch space for
    /// side-effect files on either backend).
    pub(crate) dir: tempfile::TempDir,
    /// The PostgreSQL database name and the admin URL it was created from.
    postgres: Option<(String, String)>,
}

impl BenchDb {
    /// Creates a fresh database: a new SQLite file in a temporary directory,
    /// or `keiro_b_<uuid>` on the PostgreSQL server.
    pub(crate) async fn create(backend: Backend) -> BenchResult<BenchDb> {
        let dir = tempfile::Builder::new().prefix("keiro-bench-").tempdir()?;
        match backend {
            Backend::Sqlite => Ok(BenchDb {
                url: format!("sqlite:{}", dir.path().join("keiro.db").display()),
                dir,
                postgres: None,
            }),
            Backend::Postgres => {
                let base = postgres_base_url();
                let mut admin = sqlx::PgConnection::connect(&base).await.map_err(|e| {
                    fail(format!(
                        "cannot reach PostgreSQL at {base} ({e}); set {POSTGRES_URL_ENV}"
                    ))
                })?;
                let name = format!("keiro_b_{}", uuid::Uuid::new_v4().simple());
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await?;
                let _ = admin.close().await;
                Ok(BenchDb {
                    url: with_database(&base, &name),
                    dir,
                    postgres: Some((name, base)),
                })
            }
        }
    }

    /// Drops the PostgreSQL database (`WITH (FORCE)`) or removes the SQLite
    /// directory.
    pub(crate) async fn drop_db(self) {
        if let Some((name, base)) = &self.postgres {
            match sqlx::PgConnection::connect(base).await {
                Ok(mut admin) => {
                    if let Err(e) =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(&mut admin)
                            .await
                    {
                        eprintln!("keiro-bench: could not drop database {name}: {e}");
                    }
                    let _ = admin.close().await;
                }
                Err(e) => eprintln!("keiro-bench: could not drop database {name}: {e}"),
            }
        }
    }
}

/// Where a fresh database is: what a workload body gets.
#[derive(Debug, Clone)]
pub(crate) struct DbInfo {
    /// The URL keiro connects to.
    pub(crate) url: String,
    /// A scratch directory that lives as long as the database.
    pub(crate) dir: PathBuf,
}

/// Runs `body` on a fresh database and drops the database afterwards, whether
/// the body succeeded or not.
pub(crate) async fn with_fresh_db<F, Fut, T>(backend: Backend, body: F) -> BenchResult<T>
where
    F: FnOnce(DbInfo) -> Fut,
    Fut: Future<Output = BenchResult<T>>,
{
    let db = BenchDb::create(backend).await?;
    let info = DbInfo {
        url: db.url.clone(),
        dir: db.dir.path().to_path_buf(),
    };
    let result = body(info).await;
    db.drop_db().await;
    result
}

/// The admin URL of the benchmark's PostgreSQL server.
pub(crate) fn postgres_base_url() -> String {
    std::env::var(POSTGRES_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned())
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match head[scheme_end..].find('/') {
        Some(slash) => &head[..scheme_end + slash],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

/// A store connected with keiro's own pool settings, for plain-SQL work
/// (bulk inserts, counting rows).
pub(crate) async fn plain_store(cfg: &Config, url: &str) -> BenchResult<Store> {
    Ok(Store::connect(url, &cfg.store_options()).await?)
}

/// `SELECT count(*)` of a query's rows, on either backend. `sql` uses the
/// table names of `backend` and no parameters.
pub(crate) async fn count(store: &Store, sql: &str) -> BenchResult<i64> {
    Ok(match store {
        Store::Sqlite(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await?,
        Store::Postgres(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await?,
    })
}

/// Runs one plain statement without parameters.
pub(crate) async fn execute(store: &Store, sql: &str) -> BenchResult<u64> {
    Ok(match store {
        Store::Sqlite(s) => sqlx::query(sql).execute(s.pool()).await?.rows_affected(),
        Store::Postgres(s) => sqlx::query(sql).execute(s.pool()).await?.rows_affected(),
    })
}

/// The qualified table name of keiro's workflows and steps on `backend`.
pub(crate) fn tables(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::Sqlite => ("keiro_workflows", "keiro_steps"),
        Backend::Postgres => ("keiro.workflows", "keiro.steps"),
    }
}

/// Wall-clock microseconds since the Unix epoch.
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The `p`-th percentile (0..=100) of `samples` by nearest rank.
pub(crate) fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `samples`.
pub(crate) fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

/// This process's resident set size in MiB (`VmRSS` of `/proc/self/status`).
pub(crate) fn rss_mib() -> f64 {
    status_kib("VmRSS:") / 1024.0
}

/// This process's peak resident set size in MiB (`VmHWM`).
pub(crate) fn peak_rss_mib() -> f64 {
    status_kib("VmHWM:") / 1024.0
}

fn status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix(field)
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|kib| kib.parse::<f64>().ok())
            })
        })
        .unwrap_or(f64::NAN)
}

/// This process's CPU time so far (user + system) in seconds, from
/// `/proc/self/stat` (clock ticks of 10 ms).
pub(crate) fn process_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // After the command: state is field 3, utime 14 and stime 15.
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

/// The machine's busy and total CPU time so far, in clock ticks (the `cpu`
/// line of `/proc/stat`).
pub(crate) fn machine_cpu_ticks() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// A uniformly random duration below `max` (from a v4 UUID's random bits).
pub(crate) fn random_below(max: Duration) -> Duration {
    let bits = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    let nanos = max.as_nanos().max(1) as u64;
    Duration::from_nanos(bits % nanos)
}

/// Appends one line to a side-effect file (one `write` with `O_APPEND`, so
/// lines from several processes never interleave).
pub(crate) fn append_line(path: &str, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open side-effect file {path}: {e}"));
    file.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("append to {path}: {e}"));
}

/// A child process of this binary started with a hidden subcommand: its
/// stdin to send lines to, its stdout to read lines from.
#[derive(Debug)]
pub(crate) struct ChildProc {
    child: tokio::process::Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ChildProc {
    /// Starts `keiro-bench __child <args..>` with `env` added.
    pub(crate) fn spawn(args: &[&str], env: &[(&str, &str)]) -> BenchResult<ChildProc> {
        let exe = std::env::current_exe()?;
        let mut command = Command::new(exe);
        command
            .arg("__child")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| fail("child without stdout"))?;
        Ok(ChildProc {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Reads stdout until a line starting with `prefix`; returns the rest of
    /// that line.
    pub(crate) async fn line_starting(
        &mut self,
        prefix: &str,
        within: Duration,
    ) -> BenchResult<String> {
        let lines = &mut self.lines;
        let read = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return Ok(rest.trim().to_owned());
                }
            }
            Err(fail(format!("child exited without printing `{prefix}`")))
        };
        tokio::time::timeout(within, read)
            .await
            .map_err(|_| fail(format!("child printed no `{prefix}` within {within:?}")))?
    }

    /// Writes one line to the child's stdin.
    pub(crate) async fn send(&mut self, line: &str) -> BenchResult {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| fail("child stdin closed"))?;
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Closes stdin and waits for a clean exit.
    pub(crate) async fn finish(mut self) -> BenchResult {
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .map_err(|_| fail("child did not exit within 60 s"))??;
        if !status.success() {
            return Err(fail(format!("child failed: {status}")));
        }
        Ok(())
    }

    /// SIGKILLs the child and reaps it.
    pub(crate) async fn kill(mut self) -> BenchResult {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

/// Reads one line from this process's stdin (a child's instructions);
/// `None` at end of input.
pub(crate) async fn read_stdin_line(
    lines: &mut Lines<BufReader<tokio::io::Stdin>>,
) -> BenchResult<Option<String>> {
    Ok(lines.next_line().await?)
}

/// This process's stdin as lines.
pub(crate) fn stdin_lines() -> Lines<BufReader<tokio::io::Stdin>> {
    BufReader::new(tokio::io::stdin()).lines()
}

/// Prints one line to stdout and flushes it (a child's reply to its parent).
pub(crate) fn reply(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
