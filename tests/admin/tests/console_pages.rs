//! The console's HTML pages over HTTP, on both backends: status codes,
//! security headers, escaping, paging, the timers page, and links that
//! carry the router's mount point. (The browser test drives the same pages
//! in Chromium; these check what a browser would not show.)

use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use keiro::admin::Admin;
use keiro::timers::TimerRequest;
use keiro::{step, workflow, Keiro};
use keiro_tests::timers::{dead, schedule, timers, PM};
use keiro_tests::{on_both_backends, Backend, TestDb};
use tower::ServiceExt;

on_both_backends!(
    pages_answer_with_fitting_codes_and_headers,
    stored_values_are_escaped,
    the_list_pages_through_every_instance,
    the_timers_page_lists_each_view,
);

#[step]
async fn pages_double(n: u32) -> u32 {
    n * 2
}

#[workflow]
async fn pages_count(n: u32) -> u32 {
    pages_double(n).await
}

#[workflow]
async fn pages_echo(text: String) -> Result<String, String> {
    Err(text)
}

struct Page {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn get(router: &axum::Router, path: &str) -> Page {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Page {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// The router nested at `/ops`, as an application would mount it.
fn mounted(keiro: &Keiro, token: Option<&str>) -> axum::Router {
    axum::Router::new().nest(
        "/ops",
        Admin::new(keiro.clone())
            .token(token.map(str::to_owned))
            .router(),
    )
}

/// The ids of the list's rows, in order.
fn row_ids(body: &str) -> Vec<String> {
    body.split("<tr data-id=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
        .collect()
}

async fn pages_answer_with_fitting_codes_and_headers(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    pages_count(1).id("count-1").on(&keiro).await.unwrap();
    let router = mounted(&keiro, Some("t0ken"));

    let list = get(&router, "/ops").await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.headers["content-type"], "text/html; charset=utf-8");
    let csp = list.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(list.headers["x-frame-options"], "DENY");
    assert_eq!(row_ids(&list.body), ["count-1"]);
    // Links carry the mount point.
    assert!(list.body.contains("href=\"/ops/instances/count-1\""));
    assert!(list.body.contains("src=\"/ops/assets/console.js\""));
    assert!(
        !list.body.contains("id=\"read-only\""),
        "a token is configured"
    );

    let one = get(&router, "/ops/instances/count-1").await;
    assert_eq!(one.status, StatusCode::OK);
    assert!(one.body.contains("id=\"steps\""));
    assert!(one.body.contains("<td>pages_double</td>"));

    let missing = get(&router, "/ops/instances/no-such-id").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing
        .body
        .contains("no workflow instance has id `no-such-id`"));

    let bad_status = get(&router, "/ops?status=finished").await;
    assert_eq!(bad_status.status, StatusCode::BAD_REQUEST);
    assert!(bad_status.body.contains("unknown status `finished`"));
    assert!(
        bad_status.body.contains("completed"),
        "names the valid statuses"
    );

    let bad_cursor = get(&router, "/ops?cursor=not-a-cursor").await;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);

    let js = get(&router, "/ops/assets/console.js").await;
    assert_eq!(js.status, StatusCode::OK);
    assert_eq!(js.headers["content-type"], "text/javascript; charset=utf-8");
    let css = get(&router, "/ops/assets/console.css").await;
    assert_eq!(css.headers["content-type"], "text/css; charset=utf-8");

    // Without a token: the same pages, read-only, with disabled buttons.
    let read_only = mounted(&keiro, None);
    let page = get(&read_only, "/ops/instances/count-1").await;
    assert!(page.body.contains("id=\"read-only\""));
    assert!(page.body.contains("id=\"op-fork\" disabled"));
}

async fn stored_values_are_escaped(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let hostile = r#"<script>alert(1)</script>"><img src=x onerror=alert(2)>"#;
    let out = pages_echo(hostile.into())
        .id("echo-1")
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Err(hostile.to_owned()));
    let router = mounted(&keiro, Some("t0ken"));
    let page = get(&router, "/ops/instances/echo-1").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        !page.body.contains("<script>alert"),
        "raw script in the page"
    );
    assert!(!page.body.contains("<img src=x"), "raw img in the page");
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(page
        .body
        .contains("&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"));
    // A hostile search string is echoed back as text too.
    let search = get(&router, "/ops?q=%22%3E%3Cscript%3Ex%3C%2Fscript%3E").await;
    assert!(!search.body.contains("<script>x"));
    assert!(search
        .body
        .contains("value=\"&quot;&gt;&lt;script&gt;x&lt;/script&gt;\""));
}

async fn the_list_pages_through_every_instance(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    for n in 0..57u32 {
        pages_count(n)
            .id(format!("page-{n:02}"))
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
    }
    let router = mounted(&keiro, None);
    let mut seen = Vec::new();
    let mut path = "/ops?status=pending".to_owned();
    for _ in 0..5 {
        let page = get(&router, &path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        let ids = row_ids(&page.body);
        assert!(ids.len() <= 50);
        seen.extend(ids);
        let Some(at) = page.body.find("id=\"next-page\" href=\"") else {
            break;
        };
        let rest = &page.body[at + "id=\"next-page\" href=\"".len()..];
        path = rest[..rest.find('"').unwrap()].replace("&amp;", "&");
        assert!(path.starts_with("/ops?status=pending&cursor="), "{path}");
    }
    let mut expected: Vec<String> = (0..57).map(|n| format!("page-{n:02}")).collect();
    expected.reverse();
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.reverse();
    assert_eq!(sorted, expected, "every instance once");
    assert_eq!(seen.len(), 57);
    // An id-prefix search.
    let found = get(&router, "/ops?q=page-1").await;
    let mut ids = row_ids(&found.body);
    ids.sort();
    assert_eq!(
        ids,
        (10..20).map(|n| format!("page-{n}")).collect::<Vec<_>>()
    );
}

async fn the_timers_page_lists_each_view(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let timers = timers(&db).await;
    dead(&timers, "t-dead", "<b>gateway</b> said no").await;
    let later = SystemTime::now() + Duration::from_secs(3600);
    schedule(&timers, TimerRequest::new("t-later", PM, "order-9", later)).await;
    let router = mounted(&keiro, Some("t0ken"));

    let dead_page = get(&router, "/ops/timers").await;
    assert_eq!(dead_page.status, StatusCode::OK);
    assert!(dead_page.body.contains("<tr data-id=\"t-dead\">"));
    assert!(dead_page
        .body
        .contains("&lt;b&gt;gateway&lt;/b&gt; said no"));
    assert!(dead_page.body.contains("data-op=\"timers/t-dead/resume\""));
    assert!(!dead_page.body.contains("t-later"));

    let pending = get(&router, "/ops/timers?view=pending").await;
    assert!(pending.body.contains("<tr data-id=\"t-later\">"));
    assert!(!pending.body.contains("data-id=\"t-dead\""));

    let stuck = get(&router, "/ops/timers?view=stuck").await;
    assert_eq!(stuck.status, StatusCode::OK);
    assert!(stuck.body.contains("No stuck timers."));

    let bad = get(&router, "/ops/timers?view=zombie").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("unknown timer list `zombie`"));
}
