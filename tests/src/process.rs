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
        CrashChild::spawn(binary, db, Some(executor), args, crash_at, &[])
    }

    /// Starts `binary args..` on `db` with no `KEIRO_EXECUTOR_ID`: it takes
    /// a default identity.
    pub fn start_default(binary: &str, db: &TestDb, args: &[&str]) -> CrashChild {
        CrashChild::spawn(binary, db, None, args, None, &[])
    }

    /// Starts `binary args..` on `db` with a default identity and the
    /// environment variables `env` set.
    pub fn start_with_env(
        binary: &str,
        db: &TestDb,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> CrashChild {
        CrashChild::spawn(binary, db, None, args, None, env)
    }

    fn spawn(
        binary: &str,
        db: &TestDb,
        executor: Option<&str>,
        args: &[&str],
        crash_at: Option<&str>,
        env: &[(&str, &str)],
    ) -> CrashChild {
        let mut command = Command::new(binary);
        command
            .args(args)
            .env("KEIRO_DATABASE_URL", &db.url)
            .env_remove("KEIRO_EXECUTOR_ID")
            .env_remove(CRASH_AT_ENV)
            .env_remove(keiro::APP_VERSION_ENV)
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if let Some(executor) = executor {
            command.env("KEIRO_EXECUTOR_ID", executor);
        }
        if let Some(point) = crash_at {
            command.env(CRASH_AT_ENV, point);
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("start the crash_workflow child");
        let stdout = child.stdout.take().expect("piped stdout");
        CrashChild {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// Reads stdout until a line starting with `prefix` (60 s at most).
    pub async fn line_starting(&mut self, prefix: &str) -> String {
        self.line_where(
            |line| line.starts_with(prefix),
            &format!("a line starting `{prefix}`"),
        )
        .await
    }

    /// Reads stdout until a line starting with any of `prefixes` (60 s at
    /// most): for a process that says one of several things.
    pub async fn line_starting_any(&mut self, prefixes: &[&str]) -> String {
        self.line_where(
            |line| prefixes.iter().any(|prefix| line.starts_with(prefix)),
            &format!("a line starting with one of {prefixes:?}"),
        )
        .await
    }

    /// Reads stdout until a line containing `text` (60 s at most): for log
    /// lines, which start with a timestamp.
    pub async fn line_containing(&mut self, text: &str) -> String {
        self.line_where(
            |line| line.contains(text),
            &format!("a line containing `{text}`"),
        )
        .await
    }

    /// Reads stdout until a line containing each of `texts` has shown, in
    /// any order (60 s at most for each); those lines, in `texts`' order.
    pub async fn lines_containing_all(&mut self, texts: &[&str]) -> Vec<String> {
        let mut found: Vec<Option<String>> = vec![None; texts.len()];
        while found.iter().any(Option::is_none) {
            let missing: Vec<&str> = texts
                .iter()
                .zip(&found)
                .filter(|(_, line)| line.is_none())
                .map(|(text, _)| *text)
                .collect();
            let line = self
                .line_where(
                    |line| missing.iter().any(|text| line.contains(text)),
                    &format!("a line containing one of {missing:?}"),
                )
                .await;
            for (text, slot) in texts.iter().zip(found.iter_mut()) {
                if slot.is_none() && line.contains(text) {
                    *slot = Some(line.clone());
                }
            }
        }
        found.into_iter().flatten().collect()
    }

    async fn line_where(&mut self, wanted: impl Fn(&str) -> bool, what: &str) -> String {
        let lines = &mut self.lines;
        let wait = async {
            while let Some(line) = lines.next_line().await.expect("read child stdout") {
                if wanted(&line) {
                    return line;
                }
            }
            panic!("child exited without printing {what}");
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("child printed no {what} within 60 s"))
    }

    /// Waits (60 s at most) for the child to exit; returns whether it
    /// succeeded.
    pub async fn exit_success(mut self) -> bool {
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the child exits within 60 s")
            .expect("wait for the child")
            .success()
    }

    /// Whether the child is still running (has not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the child is running")
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
    serve_until_killed_with(keiro::ResumeOptions::default()).await
}

/// [`serve_until_killed`] with the resume worker's `options` (polling every
/// 50 ms whatever they say).
pub async fn serve_until_killed_with(options: keiro::ResumeOptions) {
    tracing_subscriber::fmt()
        .with_env_filter("keiro=info")
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();
    let keiro = keiro::global().await.expect("open the database");
    let _worker = keiro
        .resume_worker(options.poll_interval(Duration::from_millis(50)))
        .await
        .expect("start the resume worker");
    std::future::pending::<()>().await;
}
