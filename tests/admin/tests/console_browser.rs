//! The web console in a real headless Chromium, on both backends: the list
//! shows running, suspended, failed and completed instances and filters by
//! status; a failed instance's page shows its error; Retry with the token
//! runs it to completion; stored `<script>` and `onerror` payloads are shown
//! as text and never run; without a token the console is read-only.
//! Screenshots of the list and an instance page land in
//! `target/console-screenshots/`.

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use keiro::admin::Admin;
use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowStatus};
use keiro_admin_tests::browser::Browser;
use keiro_tests::operator::Switches;
use keiro_tests::{on_both_backends, Backend, TestDb};

/// Shown as stored text wherever a value lands on a page: none of it may
/// run or become an element.
const HOSTILE: &str = r#"<script>window.__keiro_pwned = 1; alert(1)</script>"><img src=x onerror="window.__keiro_pwned = 2; alert(2)">"#;

/// Keys whose `console_flaky` run panics.
static FAILING: Switches = Switches::new();
/// Keys whose `console_busy` step may return.
static RELEASED: Switches = Switches::new();

#[step]
async fn console_charge(key: String) -> String {
    if FAILING.is_on(&key) {
        panic!("payment service down for {key}");
    }
    format!("charged {key}")
}

/// Panics while its key is on in [`FAILING`].
#[workflow]
async fn console_flaky(key: String) -> String {
    console_charge(key).await
}

#[step]
async fn console_shout(text: String) -> String {
    text.to_uppercase()
}

#[workflow]
async fn console_greet(name: String) -> String {
    console_shout(name).await
}

/// Fails with its input as the error: a hostile input is a hostile input,
/// output and error at once.
#[workflow]
async fn console_echo(text: String) -> Result<String, String> {
    let shouted = console_shout(text.clone()).await;
    Err(format!("{text} / {shouted}"))
}

/// Suspends for an hour.
#[workflow]
async fn console_nap(_key: String) -> u32 {
    keiro::sleep(Duration::from_secs(3600)).await;
    1
}

#[step]
async fn console_hold(key: String) -> u32 {
    let started = Instant::now();
    while !RELEASED.is_on(&key) && started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    7
}

/// Runs (holding its lease) until its key is on in [`RELEASED`].
#[workflow]
async fn console_busy(key: String) -> u32 {
    console_hold(key).await
}

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

async fn wait_status(keiro: &Keiro, id: &str, want: WorkflowStatus) {
    let started = Instant::now();
    loop {
        let status = keiro.summary(id).await.unwrap().status;
        if status == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{id} stayed {status:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Serves `router` under `/ops` (a mount point, so the pages' links must
/// carry it) on a free local port; returns the console's URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().nest("/ops", router);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/ops")
}

/// The text of the first element `css` selects, waiting up to 10 s for
/// one. Read in one script call, so a live refresh that replaces the
/// element between finding and reading it cannot make the read stale.
async fn text(client: &Client, css: &str) -> String {
    let started = Instant::now();
    loop {
        let found = client
            .execute(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                vec![serde_json::json!(css)],
            )
            .await
            .unwrap();
        if let Some(text) = found.as_str() {
            return text.to_owned();
        }
        if started.elapsed() > Duration::from_secs(10) {
            let url = client.current_url().await.map(|u| u.to_string());
            let source = client.source().await.unwrap_or_default();
            panic!("no `{css}` on {url:?}; the page:\n{source}")
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the first element `css` selects; finds it again if a live
/// refresh replaced it in between.
async fn click(client: &Client, css: &str) {
    for _ in 0..20 {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            match element.click().await {
                Ok(()) => return,
                Err(error) if error.to_string().contains("stale") => {}
                Err(error) => panic!("click `{css}`: {error}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not click `{css}`");
}

/// The ids and statuses of the list's rows.
async fn rows(client: &Client) -> Vec<(String, String)> {
    text(client, "#instances").await;
    let script = "return [...document.querySelectorAll('#instances tbody tr')]\
                  .map(r => [r.dataset.id, r.dataset.status]);";
    let value = client.execute(script, vec![]).await.unwrap();
    serde_json::from_value(value).unwrap()
}

/// Nothing a stored value carried ran or became an element.
async fn assert_inert(client: &Client, page: &str) {
    let ran = client
        .execute(
            "return [typeof window.__keiro_pwned, \
             document.querySelectorAll('img[src=\"x\"], script:not([src])').length];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        ran,
        serde_json::json!(["undefined", 0]),
        "{page}: a payload ran"
    );
    assert!(
        client.get_alert_text().await.is_err(),
        "{page}: an alert is open"
    );
}

/// Polls the page's element until its text is `want` (live refresh or the
/// operation's own refresh updates it).
async fn wait_text(client: &Client, css: &str, want: &str) {
    let started = Instant::now();
    loop {
        let now = text(client, css).await;
        if now == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "`{css}` stayed `{now}`, expected `{want}`"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn console_shows_filters_and_retries(backend: Backend) {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let db = TestDb::new(backend).await;
    let keiro = db.builder().max_attempts(1).connect().await.unwrap();
    let p = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (done, xss, crash_xss, flaky, nap, busy) = (
        format!("{p}-done"),
        format!("{p}-xss"),
        format!("{p}-crash-xss"),
        format!("{p}-flaky"),
        format!("{p}-nap"),
        format!("{p}-busy"),
    );

    // Crash-failed instances (their one attempt panics): one to retry, one
    // whose panic message (its error) is hostile.
    FAILING.set(&flaky, true);
    FAILING.set(HOSTILE, true);
    for (id, key) in [(&flaky, flaky.as_str()), (&crash_xss, HOSTILE)] {
        console_flaky(key.to_owned())
            .id(id)
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
    }
    assert_eq!(keiro.resume_once(&quiet()).await.unwrap().failed, 2);
    FAILING.set(&flaky, false);
    // Completed, failed with a hostile error, suspended, running.
    console_greet("ada".into())
        .id(&done)
        .on(&keiro)
        .await
        .unwrap();
    let echoed = console_echo(HOSTILE.into())
        .id(&xss)
        .on(&keiro)
        .await
        .unwrap();
    assert!(echoed.is_err());
    let _nap = console_nap(nap.clone())
        .id(&nap)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let _busy = console_busy(busy.clone())
        .id(&busy)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_status(&keiro, &nap, WorkflowStatus::Suspended).await;
    wait_status(&keiro, &busy, WorkflowStatus::Running).await;
    let worker = keiro.resume_worker(quiet()).await.unwrap();

    let url = serve(
        Admin::new(keiro.clone())
            .token(Some("s3cret".into()))
            .router(),
    )
    .await;
    let client = &browser.client;

    // The list: every instance, each status.
    client.goto(&url).await.unwrap();
    let mut listed = rows(client).await;
    listed.sort();
    let mut expected = vec![
        (busy.clone(), "running".to_owned()),
        (crash_xss.clone(), "failed".to_owned()),
        (done.clone(), "completed".to_owned()),
        (flaky.clone(), "failed".to_owned()),
        (nap.clone(), "suspended".to_owned()),
        (xss.clone(), "failed".to_owned()),
    ];
    expected.sort();
    assert_eq!(listed, expected);
    assert_inert(client, "the list").await;
    let shot = browser
        .screenshot(&format!("{}-list", backend_name(backend)))
        .await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);

    // Filter by status through the page's own link.
    click(client, "#status-filter a[data-status=\"failed\"]").await;
    let mut failed = rows(client).await;
    failed.sort();
    assert_eq!(
        failed,
        vec![
            (crash_xss.clone(), "failed".to_owned()),
            (flaky.clone(), "failed".to_owned()),
            (xss.clone(), "failed".to_owned())
        ]
    );
    assert!(client
        .current_url()
        .await
        .unwrap()
        .as_str()
        .contains("/ops?status=failed"));

    // Search by id prefix.
    let search = client.find(Locator::Css("#id-prefix")).await.unwrap();
    search.send_keys(&format!("{p}-fl")).await.unwrap();
    click(client, "form.search button").await;
    wait_rows(client, &[flaky.as_str()]).await;

    // The failed instance's page shows why it failed.
    click(
        client,
        &format!("#instances a[href$=\"/instances/{flaky}\"]"),
    )
    .await;
    let error = text(client, "#error").await;
    assert!(
        error.contains(&format!("payment service down for {flaky}")),
        "error shown: {error}"
    );
    assert_eq!(text(client, "#status").await, "failed");

    // Retry without the token is refused and says so.
    click(client, "#op-retry").await;
    wait_contains(client, "#op-result", "401").await;
    // With a wrong one, too.
    let token = client.find(Locator::Css("#token")).await.unwrap();
    token.send_keys("wrong").await.unwrap();
    click(client, "#op-retry").await;
    wait_contains(client, "#op-result", "403").await;
    // With the right one it runs again (under the worker) and completes.
    token.clear().await.unwrap();
    token.send_keys("s3cret").await.unwrap();
    click(client, "#op-retry").await;
    wait_text(client, "#status", "completed").await;
    let output = text(client, "#output").await;
    assert!(
        output.contains(&format!("charged {flaky}")),
        "output: {output}"
    );
    browser
        .screenshot(&format!("{}-instance", backend_name(backend)))
        .await;

    // The hostile instance: its input, output and error are text.
    client
        .goto(&format!("{url}/instances/{xss}"))
        .await
        .unwrap();
    let input = text(client, "#input").await;
    assert!(input.contains("<script>"), "input shown as text: {input}");
    assert_inert(client, "the hostile instance").await;
    let output = text(client, "#output").await;
    assert!(
        output.contains("<script>"),
        "output shown as text: {output}"
    );
    // A hostile panic message is the error in the list's detail cell.
    client
        .goto(&format!("{url}?q={}", crash_xss.replace('-', "%2D")))
        .await
        .unwrap();
    wait_rows(client, &[crash_xss.as_str()]).await;
    let detail = text(client, "#instances td.detail").await;
    assert!(
        detail.contains("<script>window.__keiro_pwned"),
        "detail: {detail}"
    );
    assert_inert(client, "the filtered list").await;

    // The running instance's page refreshes itself: release it and watch.
    client
        .goto(&format!("{url}/instances/{busy}"))
        .await
        .unwrap();
    assert_eq!(text(client, "#status").await, "running");
    RELEASED.set(&busy, true);
    wait_text(client, "#status", "completed").await;

    // Without a token the same console is read-only and says so.
    let read_only = serve(Admin::new(keiro.clone()).token(None).router()).await;
    client
        .goto(&format!("{read_only}/instances/{nap}"))
        .await
        .unwrap();
    assert!(text(client, "#read-only").await.contains("Read-only"));
    let cancel = client.find(Locator::Css("#op-cancel")).await.unwrap();
    assert!(
        cancel.attr("disabled").await.unwrap().is_some(),
        "cancel is disabled"
    );
    assert!(
        client.find(Locator::Css("#token")).await.is_err(),
        "no token field"
    );

    browser.close().await;
    worker.shutdown().await;
}

async fn wait_rows(client: &Client, want: &[&str]) {
    let started = Instant::now();
    loop {
        let ids: Vec<String> = rows(client).await.into_iter().map(|(id, _)| id).collect();
        if ids == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "rows {ids:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_contains(client: &Client, css: &str, want: &str) {
    let started = Instant::now();
    loop {
        let now = text(client, css).await;
        if now.contains(want) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "`{css}` says `{now}`, expected it to contain `{want}`"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres | Backend::PgBouncer => "postgres",
    }
}

on_both_backends!(console_shows_filters_and_retries);
