//! `keiro serve`, the real binary, on both backends: it prints the address
//! it listens on, says when it is read-only, serves the console that a
//! headless Chromium opens to see an instance and its step timeline, and
//! stops cleanly on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::Locator;
use keiro::{step, workflow};
use keiro_admin_tests::browser::Browser;
use keiro_tests::{on_both_backends, Backend, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

on_both_backends!(serve_shows_an_instance_and_its_steps);

#[step]
async fn serve_reserve(sku: String) -> String {
    format!("hold-{sku}")
}

#[step]
async fn serve_charge(cents: u64) -> String {
    format!("payment-{cents}")
}

#[step]
async fn serve_email(to: String) -> String {
    format!("sent to {to}")
}

/// Three steps, as in the quickstart.
#[workflow]
async fn serve_checkout(sku: String) -> String {
    let hold = serve_reserve(sku).await;
    let payment = serve_charge(4200).await;
    let mail = serve_email("ada@example.com".into()).await;
    format!("{hold} {payment} {mail}")
}

/// Starts `keiro serve` on a free port and returns it with the first line
/// it printed.
async fn serve(url: &str, token: Option<&str>) -> (Child, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keiro"));
    command
        .args(["--database", url, "serve", "--listen", "127.0.0.1:0"])
        .env_remove("KEIRO_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("KEIRO_ADMIN_TOKEN", token);
    }
    let mut child = command.spawn().expect("start keiro serve");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("keiro serve printed its address within 20 s")
        .unwrap()
        .expect("keiro serve printed a line");
    // Keep reading so the pipe never fills.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, line)
}

fn address(line: &str) -> String {
    let start = line.find("http://").expect("the line names a URL");
    line[start..]
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned()
}

/// Sends SIGTERM and waits for a clean exit.
async fn stop(child: Child) {
    let pid = child.id().expect("still running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("keiro serve stopped within 10 s of SIGTERM")
        .unwrap();
    assert!(
        output.status.success(),
        "keiro serve exited with {}",
        output.status
    );
}

async fn serve_shows_an_instance_and_its_steps(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let id = format!("order-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    serve_checkout("apple".into())
        .id(&id)
        .on(&keiro)
        .await
        .unwrap();

    // Without a token it says it is read-only.
    let (read_only, line) = serve(&db.url, None).await;
    assert!(line.contains("read-only"), "{line}");
    stop(read_only).await;

    let (child, line) = serve(&db.url, Some("s3cret")).await;
    assert!(
        line.starts_with("keiro console on http://127.0.0.1:") && !line.contains("read-only"),
        "{line}"
    );
    let url = address(&line);
    let Some(browser) = Browser::start().await else {
        stop(child).await;
        return;
    };
    let client = &browser.client;
    client.goto(&url).await.unwrap();
    let link = client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(&format!("a[href=\"/instances/{id}\"]")))
        .await
        .expect("the list links the instance");
    link.click().await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#steps"))
        .await
        .expect("the instance page has a step timeline");
    let steps = client
        .execute(
            "return [...document.querySelectorAll('#steps tbody tr')]\
             .map(r => r.children[2].textContent);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        steps,
        serde_json::json!(["serve_reserve", "serve_charge", "serve_email"])
    );
    let status = client.find(Locator::Css("#status")).await.unwrap();
    assert_eq!(status.text().await.unwrap(), "completed");
    let name = match backend {
        Backend::Sqlite => "serve-sqlite-instance",
        Backend::Postgres | Backend::PgBouncer => "serve-postgres-instance",
    };
    browser.screenshot(name).await;
    browser.close().await;
    stop(child).await;
}
