//! A real headless Chromium for the console's browser tests, driven over
//! WebDriver by `chromedriver` (Debian's `chromium` and `chromium-driver`
//! packages, which `.ci/run` installs).
//!
//! [`Browser::start`] returns `None` (the test says it skipped) when the
//! binaries are missing on a developer machine; under `CI=true` a missing
//! browser is a failure, so CI cannot pass without running the tests.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use tokio::process::{Child, Command};

/// The Chromium binary (override with `KEIRO_TEST_CHROMIUM`).
const CHROMIUM: &str = "/usr/bin/chromium";
/// The ChromeDriver binary (override with `KEIRO_TEST_CHROMEDRIVER`).
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A chromedriver process and one headless Chromium session on it; both
/// end when it drops (or, cleanly, at [`Browser::close`]).
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn binary(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("pick a free local port")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or `None` when
    /// they are not installed (a panic under `CI=true`).
    pub async fn start() -> Option<Browser> {
        let chromium = binary("KEIRO_TEST_CHROMIUM", CHROMIUM);
        let chromedriver = binary("KEIRO_TEST_CHROMEDRIVER", CHROMEDRIVER);
        if !chromium.exists() || !chromedriver.exists() {
            let missing = format!(
                "{} or {} is not installed (apt-get install chromium chromium-driver)",
                chromium.display(),
                chromedriver.display()
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("the console's browser tests need a browser: {missing}");
            }
            eprintln!("skipped: {missing}");
            return None;
        }
        let port = free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display()));
        let profile = tempfile::tempdir().expect("a temporary Chromium profile");
        let capabilities = capabilities(&chromium, profile.path());
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(error) if started.elapsed() < Duration::from_secs(20) => {
                    let _ = error;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("no WebDriver session from chromedriver at {url}: {error}"),
            }
        };
        Some(Browser {
            client,
            driver,
            _profile: profile,
        })
    }

    /// Ends the session and chromedriver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }

    /// Saves a screenshot of the current page as
    /// `target/console-screenshots/NAME.png` and returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("take a screenshot");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("create the screenshot directory");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }
}

/// Where screenshots go: `console-screenshots` in the workspace's target
/// directory.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("console-screenshots")
}

/// Headless Chromium as root on a machine with no outside network: no
/// sandbox, no GPU, and none of the background connections that would be
/// refused.
fn capabilities(chromium: &Path, profile: &Path) -> serde_json::Map<String, serde_json::Value> {
    let options = serde_json::json!({
        "binary": chromium.display().to_string(),
        "args": [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--window-size=1360,900",
            format!("--user-data-dir={}", profile.display()),
        ],
    });
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("browserName".into(), "chrome".into());
    capabilities.insert("goog:chromeOptions".into(), options);
    capabilities
}
