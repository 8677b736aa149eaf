//! Driving the `crash_workflow` child process: start it on a test database
//! under an executor identity, read its stdout, SIGKILL it, restart it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::workflows::CRASH_AT_ENV;
use crate::TestDb;

/// A child process of the crash tests.
#[derive(Debug)]
pub struct CrashChild {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl CrashChild {
    /// Starts `binary args..` on `db` under `executor`, blocking at
    /// `crash_at` if given (see [`crate::workflows::pause_at`]).
    pub fn start(
        binary: &str,
        db: &TestDb,
        executor: &str,
        args: &[&str],
        crash_at: Option<&str>,
    ) -> CrashChild {
        let mut command = Command::new(binary);
        command
            .args(args)
            .env("KEIRO_DATABASE_URL", &db.url)
            .env("KEIRO_EXECUTOR_ID", executor)
            .env_remove(CRASH_AT_ENV)
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if let Some(point) = crash_at {
            command.env(CRASH_AT_ENV, point);
        }
        let mut child = command.spawn().expect("start the crash_workflow child");
        let stdout = child.stdout.take().expect("piped stdout");
        CrashChild {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Reads stdout until a line starting with `prefix` (60 s at most).
    pub async fn line_starting(&mut self, prefix: &str) -> String {
        let lines = &mut self.lines;
        let wait = async {
            while let Some(line) = lines.next_line().await.expect("read child stdout") {
                if line.starts_with(prefix) {
                    return line;
                }
            }
            panic!("child exited without printing `{prefix}`");
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("child printed no `{prefix}` within 60 s"))
    }

    /// Reads stdout until a line containing `text` (60 s at most): for log
    /// lines, which start with a timestamp.
    pub async fn line_starting_containing(&mut self, text: &str) -> String {
        let lines = &mut self.lines;
        let wait = async {
            while let Some(line) = lines.next_line().await.expect("read child stdout") {
                if line.contains(text) {
                    return line;
                }
            }
            panic!("child exited without printing `{text}`");
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("child printed no `{text}` within 60 s"))
    }

    /// SIGKILLs the child and reaps it.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL the child");
        self.child.wait().await.expect("reap the child");
    }

    /// Waits for the `DONE <json> [micros]` line and a clean exit; returns
    /// the JSON value and the rest of the line.
    pub async fn done(mut self) -> (serde_json::Value, Option<u64>) {
        let line = self.line_starting("DONE").await;
        let status = self.child.wait().await.expect("wait for the child");
        assert!(status.success(), "child failed: {status}");
        let mut parts = line.split_whitespace().skip(1);
        let value = serde_json::from_str(parts.next().expect("a value")).expect("JSON value");
        (value, parts.next().and_then(|m| m.parse().ok()))
    }
}

/// The lines of a side-effect file.
pub fn lines_of(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The body of the worker test binaries: logs to stdout at `info`, runs the
/// process-wide resume worker (`KEIRO_DATABASE_URL`) until killed.
pub async fn serve_until_killed() {
    tracing_subscriber::fmt()
        .with_env_filter("keiro=info")
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();
    let keiro = keiro::global().await.expect("open the database");
    let _worker = keiro
        .resume_worker(keiro::ResumeOptions {
            poll_interval: Duration::from_millis(50),
            ..keiro::ResumeOptions::default()
        })
        .await
        .expect("start the resume worker");
    std::future::pending::<()>().await;
}
