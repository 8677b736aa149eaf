//! A throwaway PostgreSQL 15 cluster on a port of its own, for fault tests
//! that restart or stop the server (the suite's main cluster stays up).
//!
//! Made with the Debian tools (`pg_createcluster`, `pg_ctlcluster`,
//! `pg_dropcluster`), so it needs them and root. Where they are missing the
//! tests skip with a reason, except under `CI=true`, where they fail.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The PostgreSQL major version the clusters are made with.
const VERSION: &str = "15";

/// A cluster `keiro_fault_<pid>_<n>` listening on 127.0.0.1:`port` with
/// trust authentication, holding a database `keiro_fault`. Dropped (stopped
/// and removed) when this value is, also on panic.
#[derive(Debug)]
pub struct PgCluster {
    name: String,
    port: u16,
}

/// Why a cluster could not be made here: the tests print it and skip.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl PgCluster {
    /// Creates and starts a fresh cluster, or says why it cannot be made on
    /// this machine. Panics on any failure after the tools were found.
    pub fn create() -> Result<PgCluster, Unavailable> {
        if !tool_exists("pg_createcluster") {
            return Err(Unavailable(
                "pg_createcluster is not installed (Debian's postgresql-common)".into(),
            ));
        }
        let user = run_output("id", &["-u"]);
        if user.trim() != "0" {
            return Err(Unavailable(format!(
                "pg_createcluster needs root (running as uid {})",
                user.trim()
            )));
        }
        drop_stale_clusters();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "keiro_fault_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let port = free_port();
        let port_text = port.to_string();
        // From here on a failure is a broken machine, not a missing tool.
        let cluster = PgCluster { name, port };
        run(
            "pg_createcluster",
            &[
                VERSION,
                &cluster.name,
                "--port",
                &port_text,
                "--start-conf=manual",
                "--",
                "--auth-local=trust",
                "--auth-host=trust",
            ],
        );
        cluster.ctl(&["start"]);
        cluster.wait_ready();
        run(
            "psql",
            &[
                &cluster.url("postgres"),
                "-qc",
                "CREATE DATABASE keiro_fault",
            ],
        );
        Ok(cluster)
    }

    /// The cluster's name (as `pg_lsclusters` lists it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The TCP port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` on this cluster, as the superuser `postgres`
    /// over TCP.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The URL of the `keiro_fault` database.
    pub fn keiro_url(&self) -> String {
        self.url("keiro_fault")
    }

    /// `pg_ctlcluster 15 NAME restart -m immediate`: the server dies without
    /// a checkpoint (as on a crash) and comes back; returns once it accepts
    /// connections again.
    pub fn restart_immediate(&self) {
        self.ctl(&["restart", "-m", "immediate"]);
        self.wait_ready();
    }

    /// `pg_ctlcluster 15 NAME stop -m immediate`: the server dies at once
    /// and stays down until [`PgCluster::start`].
    pub fn stop_immediate(&self) {
        self.ctl(&["stop", "-m", "immediate"]);
    }

    /// Starts a stopped cluster; returns once it accepts connections.
    pub fn start(&self) {
        self.ctl(&["start"]);
        self.wait_ready();
    }

    /// An outage: the server stops at once ([`PgCluster::stop_immediate`]),
    /// stays down for `down` and starts again; returns once it accepts
    /// connections. Runs on a blocking task.
    pub async fn outage(self: &std::sync::Arc<Self>, down: std::time::Duration) {
        let cluster = self.clone();
        tokio::task::spawn_blocking(move || {
            cluster.stop_immediate();
            std::thread::sleep(down);
            cluster.start();
        })
        .await
        .expect("the outage's task");
    }

    /// Serves TLS with `cert` and `key` (copied into the cluster's
    /// configuration directory, readable by `postgres` only) and restarts.
    pub fn enable_tls(&self, cert: &std::path::Path, key: &std::path::Path) {
        let conf = format!("/etc/postgresql/{VERSION}/{}", self.name);
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let to = format!("{conf}/{to}");
            std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {from:?} to {to}: {e}"));
            run("chown", &["postgres:postgres", &to]);
            run("chmod", &["600", &to]);
        }
        let settings = format!(
            "\nssl = on\nssl_cert_file = '{conf}/server.crt'\nssl_key_file = '{conf}/server.key'\n"
        );
        let config = format!("{conf}/postgresql.conf");
        let mut text = std::fs::read_to_string(&config).expect("read postgresql.conf");
        text.push_str(&settings);
        std::fs::write(&config, text).expect("write postgresql.conf");
        self.ctl(&["restart"]);
        self.wait_ready();
    }

    fn ctl(&self, args: &[&str]) {
        let mut all = vec![VERSION, self.name.as_str()];
        all.extend_from_slice(args);
        run("pg_ctlcluster", &all);
    }

    /// Waits (30 s at most) until the server accepts connections.
    fn wait_ready(&self) {
        let port = self.port.to_string();
        for _ in 0..300 {
            let ready = Command::new("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &port])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "cluster {} did not accept connections within 30 s",
            self.name
        );
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let status = Command::new("pg_dropcluster")
            .args([VERSION, &self.name, "--stop"])
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("could not drop test cluster {} ({status:?}); drop it with `pg_dropcluster 15 {} --stop`", self.name, self.name);
        }
    }
}

/// Skips (prints `skipped: <reason>` and returns `None`) where a cluster
/// cannot be made, except under `CI=true`, where that fails the test.
pub fn cluster_or_skip(test: &str) -> Option<PgCluster> {
    match PgCluster::create() {
        Ok(cluster) => Some(cluster),
        Err(Unavailable(reason)) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{test}: cannot make a PostgreSQL test cluster under CI=true: {reason}");
            }
            eprintln!("{test} skipped: {reason}");
            None
        }
    }
}

/// Drops `keiro_fault_<pid>_*` clusters left by test processes that died
/// before their `Drop` ran (their pid is gone).
fn drop_stale_clusters() {
    let listing = run_output("pg_lsclusters", &["--no-header"]);
    for line in listing.lines() {
        let mut fields = line.split_whitespace();
        let (Some(version), Some(name)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("keiro_fault_")
            .and_then(|rest| rest.split('_').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("pg_dropcluster")
                .args([version, name, "--stop"])
                .status();
        }
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

fn tool_exists(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn run_output(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}
