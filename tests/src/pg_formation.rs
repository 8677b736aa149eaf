//! A pg_auto_failover formation on ports of its own: a monitor and two
//! PostgreSQL 15 nodes with synchronous replication, made with Debian's
//! `pg_autoctl` (packages `postgresql-15-auto-failover`,
//! `pg-auto-failover-cli`) as the `postgres` user. Stopped and removed when
//! dropped.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's PostgreSQL 15 binaries are (`pg_autoctl` needs `pg_ctl`).
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A running formation.
#[derive(Debug)]
pub struct Formation {
    dir: PathBuf,
    monitor_port: u16,
    ports: [u16; 2],
}

impl Formation {
    /// Creates a monitor and two nodes and waits (up to 3 minutes) until
    /// one is `primary` and the other `secondary`. Panics with `pg_autoctl`'s
    /// output when that fails.
    pub fn create() -> Formation {
        let base = free_port_block();
        let dir = std::env::temp_dir().join(format!("keiro-paf-{}-{base}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the formation");
        run("chown", &["postgres", &dir.display().to_string()]);
        let formation = Formation {
            dir,
            monitor_port: base,
            ports: [base + 1, base + 2],
        };
        formation.spawn(
            "monitor",
            &format!(
                "create monitor --pgdata {} --pgport {} --hostname 127.0.0.1 --auth trust --no-ssl --run",
                formation.pgdata("monitor"),
                formation.monitor_port
            ),
        );
        let monitor = formation.pgdata("monitor");
        formation.wait_for(|| {
            formation
                .autoctl(&["show", "uri", "--pgdata", &monitor])
                .is_ok()
        });
        for (n, port) in formation.ports.iter().enumerate() {
            let name = format!("node{}", n + 1);
            formation.spawn(
                &name,
                &format!(
                    "create postgres --pgdata {} --pgport {port} --hostname 127.0.0.1 --name {name} \
                     --auth trust --no-ssl --monitor \
                     'postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable' --run",
                    formation.pgdata(&name),
                    formation.monitor_port
                ),
            );
            eprintln!("formation: {name} started on port {port}");
            // The second node joins once the first is up.
            formation.wait_for(|| {
                let states = formation.states();
                states.len() > n
                    && states
                        .iter()
                        .any(|(_, state)| state == "single" || state == "primary")
            });
        }
        formation.wait_for(|| formation.settled());
        formation
    }

    /// A URL listing both nodes, for database `postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.ports[0], self.ports[1]
        )
    }

    /// The port of the node that is primary now, if one is.
    pub fn primary(&self) -> Option<u16> {
        self.states()
            .into_iter()
            .find(|(_, state)| state == "primary")
            .map(|(port, _)| port)
    }

    /// Whether one node is `primary` and the other `secondary`.
    pub fn settled(&self) -> bool {
        let states = self.states();
        states.len() == 2
            && states.iter().any(|(_, s)| s == "primary")
            && states.iter().any(|(_, s)| s == "secondary")
    }

    /// `pg_autoctl perform switchover`: the primary steps down and the
    /// secondary takes over; returns when the monitor says it is done.
    pub fn switchover(&self) {
        let node = self.pgdata("node1");
        self.autoctl(&["perform", "switchover", "--pgdata", &node])
            .unwrap_or_else(|e| panic!("switchover: {e}"));
    }

    /// SIGKILLs the primary's postmaster (its `postmaster.pid`'s first line).
    /// Returns the port it served.
    pub fn kill_primary_postmaster(&self) -> u16 {
        let port = self.primary().expect("a primary to kill");
        let index = self.ports.iter().position(|p| *p == port).unwrap();
        let pid_file =
            PathBuf::from(self.pgdata(&format!("node{}", index + 1))).join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).expect("read postmaster.pid");
        let pid = text.lines().next().expect("a pid").trim().to_owned();
        run("kill", &["-9", &pid]);
        port
    }

    /// Waits (up to 3 minutes) until `ready`.
    pub fn wait_for(&self, ready: impl Fn() -> bool) {
        let started = Instant::now();
        while !ready() {
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "the formation did not get there within 3 minutes; its logs are in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `(port, reported state)` of each node.
    fn states(&self) -> Vec<(u16, String)> {
        let Ok(json) = self.autoctl(&[
            "show",
            "state",
            "--json",
            "--pgdata",
            &self.pgdata("monitor"),
        ]) else {
            return Vec::new();
        };
        let nodes: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap_or_default();
        nodes
            .iter()
            .filter_map(|node| {
                let port = node["nodeport"].as_u64()? as u16;
                let state = node["current_group_state"].as_str()?.to_owned();
                Some((port, state))
            })
            .collect()
    }

    fn pgdata(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The environment every `pg_autoctl` runs with: its binaries, and its
    /// configuration and state kept inside the formation's directory.
    fn env(&self) -> String {
        format!(
            "PATH={PG_BIN}:$PATH XDG_CONFIG_HOME={dir}/config XDG_DATA_HOME={dir}/data \
             XDG_RUNTIME_DIR={dir}/run",
            dir = self.dir.display()
        )
    }

    /// Starts `pg_autoctl <args>` in the background, logging to `<log>.log`.
    fn spawn(&self, log: &str, args: &str) {
        let script = format!(
            "{} nohup pg_autoctl {args} > {}/{log}.log 2>&1 &",
            self.env(),
            self.dir.display()
        );
        run("su", &["postgres", "-c", &script]);
    }

    /// Runs `pg_autoctl <args>`; its standard output, or its whole output as
    /// the error.
    fn autoctl(&self, args: &[&str]) -> Result<String, String> {
        let script = format!("{} pg_autoctl {}", self.env(), args.join(" "));
        let output = Command::new("su")
            .args(["postgres", "-c", &script])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        for name in ["node2", "node1", "monitor"] {
            let _ = self.autoctl(&["stop", "--immediate", "--pgdata", &self.pgdata(name)]);
        }
        std::thread::sleep(Duration::from_secs(2));
        // A failed test keeps the logs.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The first of three consecutive free ports.
fn free_port_block() -> u16 {
    loop {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a free port");
        let base = listener.local_addr().expect("its address").port();
        drop(listener);
        if base < 65_000
            && (1..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}
