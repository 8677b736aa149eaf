//! A pgbouncer in transaction pooling mode in front of the test server,
//! started once per test process on a port of its own.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

use crate::PostgresServer;

/// A running pgbouncer (`pool_mode = transaction`) that forwards every
/// database of the test server. It stops when the process that started it
/// exits.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    user: String,
}

/// Where Debian installs pgbouncer (`/usr/sbin` is not on every `PATH`).
const CANDIDATES: [&str; 3] = [
    "pgbouncer",
    "/usr/sbin/pgbouncer",
    "/usr/local/sbin/pgbouncer",
];

impl PgBouncer {
    /// The pgbouncer of this process in front of `server`, started on first
    /// use. Panics (failing the test) with what to install or fix when it
    /// cannot start.
    pub fn shared(server: &PostgresServer) -> &'static PgBouncer {
        static SHARED: OnceLock<Result<PgBouncer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| PgBouncer::start(server.url()))
            .as_ref()
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// A URL for `database` through this pgbouncer, with keiro's
    /// `pooler=transaction`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{database}?pooler=transaction",
            self.user, self.port
        )
    }

    /// Starts pgbouncer in front of the server at `server_url`.
    pub fn start(server_url: &str) -> Result<PgBouncer, String> {
        let binary = CANDIDATES
            .iter()
            .find(|candidate| {
                Command::new(candidate)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success())
            })
            .ok_or(
                "pgbouncer is not installed: install Debian's `pgbouncer` package (`.ci/run` \
                 does)",
            )?;
        let server = PgConnectOptions::from_str(server_url)
            .map_err(|e| format!("cannot read the test server's URL: {e}"))?;
        let host = match server.get_socket() {
            Some(socket) => socket.display().to_string(),
            None => server.get_host().to_owned(),
        };
        let user = server.get_username().to_owned();
        // pgbouncer refuses to run as root: then it runs as `postgres` and
        // reaches the server as that role (peer authentication on the
        // socket), which is a superuser like the test role.
        let as_root = command_output("id", &["-u"])? == "0";
        let server_user = if as_root { " user=postgres" } else { "" };
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("keiro-pgbouncer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let config = format!(
            "[databases]\n* = host={host} port={}{server_user}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {}\npool_mode = transaction\n\
             max_client_conn = 2000\ndefault_pool_size = 20\n",
            server.get_port(),
            dir.join("users.txt").display(),
        );
        write(&dir.join("pgbouncer.ini"), &config)?;
        write(
            &dir.join("users.txt"),
            &format!("\"{user}\" \"\"\n\"postgres\" \"\"\n"),
        )?;
        let mut switch_user = "";
        if as_root {
            command_output("chown", &["-R", "postgres", &dir.display().to_string()])?;
            command_output("chmod", &["755", &dir.display().to_string()])?;
            switch_user = "-u postgres";
        }
        // A watchdog shell stops pgbouncer when this process exits (a test
        // binary never runs destructors of statics).
        let script = format!(
            "{binary} {switch_user} {dir}/pgbouncer.ini 2>>{dir}/pgbouncer.log & pb=$!; \
             while kill -0 {me} 2>/dev/null && kill -0 $pb 2>/dev/null; do sleep 0.5; done; \
             kill $pb 2>/dev/null; rm -rf {dir}",
            dir = dir.display(),
            me = std::process::id(),
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start pgbouncer: {e}"))?;
        let started = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                let log = std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default();
                return Err(format!(
                    "pgbouncer did not listen on 127.0.0.1:{port} within 10 s; its log:\n{log}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(PgBouncer { port, user })
    }
}

/// A port nobody listens on now.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("find a free port: {e}"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| format!("find a free port: {e}"))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::File::create(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("write {}: {e}", path.display()))
}

/// Runs `program args` and returns its trimmed standard output.
fn command_output(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("run {program}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
