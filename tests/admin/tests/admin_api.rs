//! The admin HTTP API (`keiro::admin::router`), every endpoint on both
//! backends, driven through the router as a tower service: listing with
//! filters and cursors, one instance's detail (journal, children, pending
//! awakeables and waiting messages), the operations and the timer pages;
//! refusals as JSON with keiro's own sentences and fitting codes (400, 401,
//! 403, 404, 409); and a failed instance retried through the API that then
//! completes.

use std::collections::HashSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use keiro::admin::{Admin, ADMIN_TOKEN_ENV};
use keiro::timers::{TimerError, TimerId, TimerRequest, TimerStatus};
use keiro::{step, workflow, Error, Keiro, ListFilter, ResumeOptions, WorkflowStatus};
use keiro_tests::operator::{set_aside, Switches};
use keiro_tests::{on_both_backends, ran, runs, Backend, TestDb};
use serde_json::{json, Value};
use tower::ServiceExt;

// ---------------------------------------------------------------- workflows

/// Keys whose `api_crash` run panics after its first step.
static CRASHING: Switches = Switches::new();

#[step]
async fn api_mark(key: String, n: u32) -> u32 {
    ran(&key, &format!("step {n}"));
    n
}

/// Three steps, journaled at seq 0, 1 and 2.
#[workflow]
async fn api_steps(key: String) -> u32 {
    api_mark(key.clone(), 1).await + api_mark(key.clone(), 2).await + api_mark(key, 3).await
}

/// One step, then a crash while `crashing(key)`, then a second step.
#[workflow]
async fn api_crash(key: String) -> u32 {
    let first = api_mark(key.clone(), 1).await;
    if CRASHING.is_on(&key) {
        panic!("crash after step 1 of {key}");
    }
    first + api_mark(key, 2).await
}

/// `api_steps` as a child (seq 0), then one step of its own.
#[workflow]
async fn api_parent(key: String) -> u32 {
    let child = api_steps(format!("{key}-child")).await.unwrap();
    child + api_mark(key, 10).await
}

#[step]
async fn api_hand_out(key: String, awakeable_id: String) -> bool {
    ran(&key, &format!("awakeable {awakeable_id}"));
    true
}

/// Waits on an awakeable (answered with a string), then for a message on
/// topic `note`.
#[workflow]
async fn api_wait(key: String) -> Result<String, String> {
    let answer = keiro::awakeable::<String>().await;
    api_hand_out(key, answer.id().to_string()).await;
    let said = answer.await.map_err(|e| e.to_string())?;
    let note = keiro::recv::<String>("note")
        .await
        .map_err(|e| e.to_string())?;
    Ok(format!("{said} {note}"))
}

// ------------------------------------------------------------------ fixture

const TOKEN: &str = "s3cret-admin-token";

/// A database with one instance in each interesting state, the runtime (in
/// this process) that runs them, and the admin router on it.
struct Fixture {
    _db: TestDb,
    keiro: Keiro,
    /// The router with [`TOKEN`] configured.
    api: Router,
    /// Completed `api_steps`.
    done: String,
    /// `api_crash`, failed after its crash attempt.
    crashed: String,
    /// Two `api_wait`, suspended on their awakeables.
    waiting: [String; 2],
    /// Completed `api_parent`, whose child is `{parent}/0`.
    parent: String,
}

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

impl Fixture {
    async fn new(backend: Backend) -> Fixture {
        let db = TestDb::new(backend).await;
        let keiro = db
            .builder()
            .max_attempts(1)
            .suspend_after(Duration::from_millis(50))
            .connect()
            .await
            .unwrap();
        let tag = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        let key = |what: &str| format!("{what}-{tag}");
        let fixture = Fixture {
            api: Admin::new(keiro.clone())
                .token(Some(TOKEN.to_owned()))
                .router(),
            done: key("done"),
            crashed: key("crash"),
            waiting: [key("wait-a"), key("wait-b")],
            parent: key("parent"),
            _db: db,
            keiro,
        };
        let keiro = &fixture.keiro;
        let done = &fixture.done;
        assert_eq!(api_steps(done.clone()).id(done).on(keiro).await.unwrap(), 6);
        let parent = &fixture.parent;
        let result = api_parent(parent.clone()).id(parent).on(keiro).await;
        assert_eq!(result.unwrap(), 16);
        CRASHING.set(&fixture.crashed, true);
        let c = &fixture.crashed;
        api_crash(c.clone())
            .id(c)
            .on(keiro)
            .enqueue()
            .await
            .unwrap();
        for w in &fixture.waiting {
            api_wait(w.clone()).id(w).on(keiro).enqueue().await.unwrap();
        }
        let summary = keiro.resume_once(&quiet()).await.unwrap();
        assert_eq!(
            (summary.failed, summary.still_suspended),
            (1, 2),
            "{summary:?}"
        );
        fixture
    }

    /// The router of `keiro` with no token: read-only.
    fn read_only(&self) -> Router {
        Admin::new(self.keiro.clone()).token(None).router()
    }

    async fn status(&self, id: &str) -> WorkflowStatus {
        self.keiro.summary(id).await.unwrap().status
    }

    /// Runs resume passes until every one of `ids` is completed (bounded).
    /// A pass can find nothing due when this process already picked an
    /// instance up on its own wake-up, so one pass is not enough to assert.
    async fn run_to_completion(&self, ids: &[&str]) {
        for _ in 0..200 {
            let mut done = true;
            for id in ids {
                done &= self.status(id).await == WorkflowStatus::Completed;
            }
            if done {
                return;
            }
            self.keiro.resume_once(&quiet()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for id in ids {
            assert_eq!(self.status(id).await, WorkflowStatus::Completed, "{id}");
        }
    }

    /// The child `api_parent` started.
    fn child(&self) -> String {
        format!("{}/0", self.parent)
    }
}

/// What one request answered.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    /// Asserts `200 OK` and returns the body.
    fn ok(self) -> Value {
        assert_eq!(self.status, StatusCode::OK, "{:#}", self.body);
        self.body
    }

    /// Asserts a refusal with `status` and `kind`; returns its `error` text.
    fn refused(self, status: StatusCode, kind: &str) -> String {
        assert_eq!(self.status, status, "{:#}", self.body);
        assert_eq!(self.body["kind"], kind, "{:#}", self.body);
        let error = self.body["error"].as_str().expect("an error text");
        assert!(!error.is_empty());
        error.to_owned()
    }
}

/// Sends `method uri` (with `Authorization: Bearer token` when given, and
/// `body` as JSON when given) to `router`; the answer must be JSON.
async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let body = match body {
        Some(text) => {
            request = request.header("content-type", "application/json");
            Body::from(text.to_owned())
        }
        None => Body::empty(),
    };
    let response = router
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{method} {uri} answered {status} with no JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    Answer { status, body }
}

async fn get(router: &Router, uri: &str) -> Answer {
    call(router, "GET", uri, None, None).await
}

/// `POST uri` with the admin token.
async fn post(router: &Router, uri: &str, body: Option<&str>) -> Answer {
    call(router, "POST", uri, Some(TOKEN), body).await
}

/// `id` percent-encoded for a path segment (`/` and every other byte that
/// is not unreserved).
fn enc(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn ids(list: &Value, key: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("no `{key}` array in {list:#}"))
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The awakeable id `api_wait` instance `key` handed out.
fn awakeable_of(key: &str) -> String {
    runs(key)
        .iter()
        .find_map(|line| line.strip_prefix("awakeable ").map(str::to_owned))
        .unwrap_or_else(|| panic!("{key} handed out no awakeable"))
}

/// keiro's sentence for an unknown instance id.
fn no_instance(id: &str) -> String {
    Error::NotFound { id: id.into() }.to_string()
}

// -------------------------------------------------------------------- tests

async fn health_and_listing_with_filters_and_cursors(backend: Backend) {
    let f = Fixture::new(backend).await;
    let health = get(&f.api, "/api/health").await.ok();
    let name = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres | Backend::PgBouncer => "postgres",
    };
    assert_eq!(health, json!({ "backend": name, "read_only": false }));
    let health = get(&f.read_only(), "/api/health").await.ok();
    assert_eq!(health["read_only"], true);
    // An unknown route under /api is a JSON 404 naming it, not an empty body.
    let unknown = get(&f.api, "/api/instancez").await;
    let error = unknown.refused(StatusCode::NOT_FOUND, "no_route");
    assert!(error.contains("`GET /api/instancez`"), "{error}");
    let wrong_method = call(&f.api, "DELETE", "/api/health", Some(TOKEN), None).await;
    let error = wrong_method.refused(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    assert_eq!(error, "`/api/health` does not take DELETE");

    // Everything: the five instances and the parent's child, newest first.
    let all = get(&f.api, "/api/instances").await.ok();
    assert_eq!(ids(&all, "instances").len(), 6, "{all:#}");
    assert_eq!(all["next_cursor"], Value::Null);
    let expected = f.keiro.list(&ListFilter::default()).await.unwrap();
    let expected: Vec<Value> = expected
        .items
        .iter()
        .map(keiro::admin::json::summary)
        .collect();
    assert_eq!(all["instances"], Value::Array(expected));

    let failed = get(&f.api, "/api/instances?status=failed").await.ok();
    assert_eq!(ids(&failed, "instances"), [f.crashed.as_str()]);
    let item = &failed["instances"][0];
    assert_eq!(item["status"], "failed");
    assert_eq!(item["name"], "api_crash");
    assert!(item["error"]
        .as_str()
        .unwrap()
        .contains("crash after step 1"));

    let waiting = get(&f.api, "/api/instances?status=suspended&oldest_first=true")
        .await
        .ok();
    assert_eq!(ids(&waiting, "instances"), f.waiting.to_vec());
    assert_eq!(waiting["instances"][0]["waiting_on"]["kind"], "awakeable");
    let two = get(
        &f.api,
        "/api/instances?status=completed,failed&name=api_steps",
    )
    .await
    .ok();
    assert_eq!(ids(&two, "instances"), [f.child(), f.done.clone()]);
    let prefix = format!("/api/instances?id_prefix={}", enc(&f.parent));
    assert_eq!(
        ids(&get(&f.api, &prefix).await.ok(), "instances"),
        [f.child(), f.parent.clone()]
    );
    let children = format!("/api/instances?parent_id={}", enc(&f.parent));
    let children = get(&f.api, &children).await.ok();
    assert_eq!(ids(&children, "instances"), [f.child()]);
    assert_eq!(children["instances"][0]["parent_id"], f.parent);

    // Paging: two at a time visits all six once.
    let mut seen = Vec::new();
    let mut uri = "/api/instances?limit=2&oldest_first=true".to_owned();
    loop {
        let page = get(&f.api, &uri).await.ok();
        seen.extend(ids(&page, "instances"));
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                uri = format!("/api/instances?limit=2&oldest_first=true&cursor={cursor}")
            }
            None => break,
        }
        assert!(seen.len() <= 6, "paging does not end: {seen:?}");
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 6, "{seen:?}");

    // Bad input: 400, in JSON, saying what is wrong.
    let error = get(&f.api, "/api/instances?status=failed,bogus")
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_status");
    assert!(error.contains("`bogus`"), "{error}");
    assert!(error.contains("pending, running, suspended"), "{error}");
    let error = get(&f.api, "/api/instances?cursor=garbage")
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_cursor");
    let expected = f
        .keiro
        .list(&ListFilter::default().cursor("garbage"))
        .await
        .unwrap_err();
    assert_eq!(error, expected.to_string());
    let error = get(&f.api, "/api/instances?limit=0")
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_option");
    let expected = f
        .keiro
        .list(&ListFilter::default().limit(0))
        .await
        .unwrap_err();
    assert_eq!(error, expected.to_string());
    get(&f.api, "/api/instances?limit=many")
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_query");
}

async fn one_instance_with_its_steps_children_and_waits(backend: Backend) {
    let f = Fixture::new(backend).await;
    let done = get(&f.api, &format!("/api/instances/{}", enc(&f.done)))
        .await
        .ok();
    assert_eq!(done["instance"]["id"], f.done);
    assert_eq!(done["instance"]["status"], "completed");
    assert_eq!(done["input"], json!([f.done]));
    assert_eq!(done["output"], 6);
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{done:#}");
    for (n, step) in steps.iter().enumerate() {
        assert_eq!(step["seq"], n);
        assert_eq!(step["kind"], "step");
        assert_eq!(step["name"], "api_mark");
        assert_eq!(step["outcome"], "ok");
        assert_eq!(step["value"], n + 1);
        assert_eq!(step["attempts"], 1);
        assert!(step["started_at"].as_str().unwrap().ends_with('Z'));
        assert!(step["finished_at"].as_str().unwrap().ends_with('Z'));
        assert!(step["duration_ms"].as_f64().unwrap() >= 0.0);
    }
    let journal = f.keiro.steps(&f.done).await.unwrap();
    let shaped: Vec<Value> = journal.iter().map(keiro::admin::json::step).collect();
    // Compared as sent: through JSON text, as the client read it.
    let sent: Value = serde_json::from_str(&Value::Array(shaped).to_string()).unwrap();
    assert_eq!(done["steps"], sent);
    assert_eq!(done["children"], json!([]));
    assert_eq!(done["awakeables"], json!([]));
    assert_eq!(done["messages"], json!([]));

    // The parent lists its child; the child's id holds a `/`.
    let parent = get(&f.api, &format!("/api/instances/{}", enc(&f.parent)))
        .await
        .ok();
    assert_eq!(ids(&parent, "children"), [f.child()]);
    assert_eq!(parent["steps"][0]["kind"], "child");
    let child = get(&f.api, &format!("/api/instances/{}", enc(&f.child())))
        .await
        .ok();
    assert_eq!(child["instance"]["parent_id"], f.parent);
    assert_eq!(child["output"], 6);

    // A failed instance shows why.
    let crashed = get(&f.api, &format!("/api/instances/{}", enc(&f.crashed)))
        .await
        .ok();
    assert_eq!(crashed["instance"]["status"], "failed");
    let error = crashed["instance"]["error"].as_str().unwrap();
    assert!(error.contains("crash after step 1"), "{error}");

    // A suspended one: its unanswered awakeable, with the id to answer it.
    let waiting = &f.waiting[0];
    let detail = get(&f.api, &format!("/api/instances/{}", enc(waiting)))
        .await
        .ok();
    assert_eq!(detail["instance"]["status"], "suspended");
    let awakeables = detail["awakeables"].as_array().unwrap();
    assert_eq!(awakeables.len(), 1, "{detail:#}");
    assert_eq!(awakeables[0]["id"], awakeable_of(waiting));
    assert_eq!(awakeables[0]["seq"], 0);
    assert!(awakeables[0]["awaited_type"]
        .as_str()
        .unwrap()
        .contains("String"));
    assert_eq!(detail["steps"][0]["awakeable_id"], awakeable_of(waiting));

    // Unknown: 404 with keiro's sentence.
    let error = get(&f.api, "/api/instances/nobody-here")
        .await
        .refused(StatusCode::NOT_FOUND, "not_found");
    assert_eq!(error, no_instance("nobody-here"));
    assert_eq!(
        error,
        f.keiro
            .summary("nobody-here")
            .await
            .unwrap_err()
            .to_string()
    );
}

async fn operations_need_the_token(backend: Backend) {
    let f = Fixture::new(backend).await;
    let awakeable = enc(&awakeable_of(&f.waiting[0]));
    let crashed = enc(&f.crashed);
    let timers = f.keiro.timers();
    keiro_tests::timers::dead(&timers, "t-dead", "gave up").await;
    let posts: Vec<(String, Option<&str>)> = vec![
        (format!("/api/instances/{crashed}/cancel"), None),
        (format!("/api/instances/{crashed}/retry"), None),
        (format!("/api/instances/{crashed}/resume"), None),
        (
            format!("/api/instances/{crashed}/fork"),
            Some(r#"{"from_step": 0}"#),
        ),
        (
            format!("/api/instances/{}/messages", enc(&f.waiting[0])),
            Some(r#"{"topic": "note", "value": "x"}"#),
        ),
        (
            format!("/api/awakeables/{awakeable}/resolve"),
            Some("\"x\""),
        ),
        (
            format!("/api/awakeables/{awakeable}/reject"),
            Some(r#"{"reason": "no"}"#),
        ),
        ("/api/timers/t-dead/requeue".to_owned(), None),
        ("/api/timers/t-dead/resume".to_owned(), None),
    ];
    let read_only = f.read_only();
    for (uri, body) in &posts {
        call(&f.api, "POST", uri, None, *body)
            .await
            .refused(StatusCode::UNAUTHORIZED, "unauthorized");
        call(&f.api, "POST", uri, Some("not-the-token"), *body)
            .await
            .refused(StatusCode::FORBIDDEN, "forbidden");
        let error = call(&read_only, "POST", uri, Some(TOKEN), *body)
            .await
            .refused(StatusCode::FORBIDDEN, "read_only");
        assert!(error.contains("read-only"), "{error}");
        assert!(error.contains(ADMIN_TOKEN_ENV), "{error}");
    }
    // Nothing changed.
    assert_eq!(f.status(&f.crashed).await, WorkflowStatus::Failed);
    for w in &f.waiting {
        assert_eq!(f.status(w).await, WorkflowStatus::Suspended);
    }
    let row = timers.get(&TimerId::new("t-dead")).await.unwrap().unwrap();
    assert_eq!(row.status, TimerStatus::Dead);
    let page = get(&f.api, &format!("/api/instances/{}", f.waiting[0]))
        .await
        .ok();
    assert_eq!(page["messages"], json!([]));
    // Reads need no token, on either router.
    get(&read_only, "/api/instances").await.ok();
    get(&read_only, "/api/timers?view=dead").await.ok();
    get(&read_only, &format!("/api/instances/{crashed}"))
        .await
        .ok();
}

async fn retry_through_the_api_runs_a_failed_instance_to_completion(backend: Backend) {
    let f = Fixture::new(backend).await;
    let uri = format!("/api/instances/{}/retry", enc(&f.crashed));
    CRASHING.set(&f.crashed, false);
    let retried = post(&f.api, &uri, None).await.ok();
    assert_eq!(retried["outcome"], "retried");
    assert_eq!(retried["instance"]["id"], f.crashed);
    assert_eq!(retried["instance"]["status"], "pending");
    f.run_to_completion(&[&f.crashed]).await;
    let handle = f.keiro.handle::<u32>(&f.crashed).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), 3);
    // Step 1 was journaled before the crash: the retry replayed it.
    assert_eq!(runs(&f.crashed), ["step 1", "step 2"]);

    // Completed now: a second retry is a refused transition.
    let error = post(&f.api, &uri, None)
        .await
        .refused(StatusCode::CONFLICT, "not_retryable");
    let expected = f.keiro.retry(&f.crashed).await.unwrap_err();
    assert_eq!(error, expected.to_string());
    assert!(
        error.contains("is completed and cannot be retried"),
        "{error}"
    );
    let error = post(&f.api, "/api/instances/nobody/retry", None)
        .await
        .refused(StatusCode::NOT_FOUND, "not_found");
    assert_eq!(error, no_instance("nobody"));
}

async fn cancel_resume_and_fork(backend: Backend) {
    let f = Fixture::new(backend).await;
    // Cancel a suspended instance; a second cancel is refused.
    let target = &f.waiting[1];
    let uri = format!("/api/instances/{}/cancel", enc(target));
    let cancelled = post(&f.api, &uri, None).await.ok();
    assert_eq!(cancelled["outcome"], "cancelled");
    assert_eq!(cancelled["cancelled"], json!([target]));
    assert_eq!(cancelled["instance"]["status"], "cancelled");
    assert_eq!(f.status(target).await, WorkflowStatus::Cancelled);
    let error = post(&f.api, &uri, None)
        .await
        .refused(StatusCode::CONFLICT, "already_finished");
    assert!(error.contains("cancelled"), "{error}");
    post(&f.api, "/api/instances/nobody/cancel", None)
        .await
        .refused(StatusCode::NOT_FOUND, "not_found");
    // Its awakeable is no longer pending, and answering it is refused.
    let detail = get(&f.api, &format!("/api/instances/{}", enc(target)))
        .await
        .ok();
    assert_eq!(detail["awakeables"], json!([]));
    let awakeable = awakeable_of(target);
    let resolve = format!("/api/awakeables/{}/resolve", enc(&awakeable));
    let error = post(&f.api, &resolve, Some("\"late\""))
        .await
        .refused(StatusCode::CONFLICT, "awakeable_workflow_finished");
    let expected = f
        .keiro
        .resolve_awakeable_json(&awakeable, json!("late"))
        .await;
    assert_eq!(error, expected.unwrap_err().to_string());

    // Resume takes only a set-aside instance.
    let uri = format!("/api/instances/{}/resume", enc(&f.done));
    let error = post(&f.api, &uri, None)
        .await
        .refused(StatusCode::CONFLICT, "not_set_aside");
    let expected = f.keiro.resume(&f.done).await.unwrap_err();
    assert_eq!(error, expected.to_string());

    // Fork from step 1 under a chosen id; the id is then taken.
    let uri = format!("/api/instances/{}/fork", enc(&f.done));
    let new_id = format!("{}-forked", f.done);
    let body = json!({ "from_step": 1, "new_id": new_id }).to_string();
    let forked = post(&f.api, &uri, Some(&body)).await.ok();
    assert_eq!(forked["id"], new_id);
    assert_eq!(forked["instance"]["status"], "pending");
    assert_eq!(forked["instance"]["name"], "api_steps");
    let error = post(&f.api, &uri, Some(&body))
        .await
        .refused(StatusCode::CONFLICT, "id_conflict");
    assert!(error.contains(&new_id), "{error}");
    // A generated id.
    let generated = post(&f.api, &uri, Some(r#"{"from_step": 0}"#)).await.ok();
    let generated = generated["id"].as_str().unwrap();
    assert!(
        generated.starts_with(&format!("{}-fork-", f.done)),
        "{generated}"
    );
    // Bad bodies: 400 in JSON.
    post(&f.api, &uri, Some(r#"{"from_step": -1}"#))
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_from_step");
    post(&f.api, &uri, Some(r#"{"from_step": 1"#))
        .await
        .refused(StatusCode::BAD_REQUEST, "malformed_json");
    post(&f.api, &uri, Some(r#"{"from": 1}"#))
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_json_body");
    post(
        &f.api,
        "/api/instances/nobody/fork",
        Some(r#"{"from_step": 0}"#),
    )
    .await
    .refused(StatusCode::NOT_FOUND, "not_found");

    // The fork runs to completion; set aside, it can be resumed.
    f.run_to_completion(&[&new_id, generated]).await;
    set_aside(&f.keiro, &new_id).await;
    let set_aside_page = get(&f.api, "/api/instances?status=nondeterministic")
        .await
        .ok();
    assert_eq!(ids(&set_aside_page, "instances"), [new_id.as_str()]);
    let uri = format!("/api/instances/{}/resume", enc(&new_id));
    let resumed = post(&f.api, &uri, None).await.ok();
    assert_eq!(resumed["outcome"], "resumed");
    assert_eq!(resumed["instance"]["status"], "pending");
}

async fn awakeables_and_messages_from_outside(backend: Backend) {
    let f = Fixture::new(backend).await;
    let [first, second] = &f.waiting;

    // A message waits in the instance's detail until it is received.
    let uri = format!("/api/instances/{}/messages", enc(first));
    let sent = post(&f.api, &uri, Some(r#"{"topic": "note", "value": "hi"}"#))
        .await
        .ok();
    assert_eq!(sent["outcome"], "sent");
    assert_eq!(sent["instance"]["id"], *first);
    let detail = get(&f.api, &format!("/api/instances/{}", enc(first)))
        .await
        .ok();
    let messages = detail["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{detail:#}");
    assert_eq!(messages[0]["topic"], "note");
    assert_eq!(messages[0]["value"], "hi");
    assert!(messages[0]["sent_at"].as_str().unwrap().ends_with('Z'));
    post(&f.api, &uri, Some(r#"{"topic": "note""#))
        .await
        .refused(StatusCode::BAD_REQUEST, "malformed_json");
    post(&f.api, &uri, Some(r#"{"value": 1}"#))
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_json_body");
    // A body that is not declared JSON is refused in JSON too.
    let mut plain = Request::builder()
        .method("POST")
        .uri(&uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::from(r#"{"topic": "note", "value": 1}"#))
        .unwrap();
    plain
        .headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    let response = f.api.clone().oneshot(plain).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["kind"], "missing_json_content_type");
    let error = post(
        &f.api,
        "/api/instances/nobody/messages",
        Some(r#"{"topic": "note", "value": 1}"#),
    )
    .await
    .refused(StatusCode::NOT_FOUND, "not_found");
    assert_eq!(error, no_instance("nobody"));

    // Resolve the awakeable: the instance runs to its end.
    let awakeable = awakeable_of(first);
    let uri = format!("/api/awakeables/{}/resolve", enc(&awakeable));
    let resolved = post(&f.api, &uri, Some("\"yes\"")).await.ok();
    assert_eq!(
        resolved,
        json!({ "outcome": "resolved", "awakeable_id": awakeable })
    );
    let error = post(&f.api, &uri, Some("\"again\""))
        .await
        .refused(StatusCode::CONFLICT, "already_resolved");
    assert_eq!(
        error,
        Error::AlreadyResolved {
            id: awakeable.clone()
        }
        .to_string()
    );
    post(&f.api, &uri, Some("{not json"))
        .await
        .refused(StatusCode::BAD_REQUEST, "malformed_json");
    f.run_to_completion(&[first]).await;
    let handle = f
        .keiro
        .handle::<Result<String, String>>(first)
        .await
        .unwrap();
    assert_eq!(handle.result().await.unwrap(), Ok("yes hi".to_owned()));
    let detail = get(&f.api, &format!("/api/instances/{}", enc(first)))
        .await
        .ok();
    assert_eq!(detail["messages"], json!([]));
    assert_eq!(detail["awakeables"], json!([]));
    // An ended instance takes no messages.
    let error = post(
        &f.api,
        &format!("/api/instances/{}/messages", enc(first)),
        Some(r#"{"topic": "note", "value": "late"}"#),
    )
    .await
    .refused(StatusCode::CONFLICT, "not_receiving");
    let expected = f.keiro.send(first, "note", &"late").await.unwrap_err();
    assert_eq!(error, expected.to_string());

    // Reject the other one: its workflow gets the rejection.
    let awakeable = awakeable_of(second);
    let uri = format!("/api/awakeables/{}/reject", enc(&awakeable));
    post(&f.api, &uri, Some(r#"{"why": "no"}"#))
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_json_body");
    let rejected = post(&f.api, &uri, Some(r#"{"reason": "not today"}"#))
        .await
        .ok();
    assert_eq!(rejected["outcome"], "rejected");
    f.keiro.resume_once(&quiet()).await.unwrap();
    let handle = f
        .keiro
        .handle::<Result<String, String>>(second)
        .await
        .unwrap();
    let outcome = handle.result().await.unwrap();
    assert!(
        outcome.as_ref().unwrap_err().contains("not today"),
        "{outcome:?}"
    );
    // Answered already: a second answer is refused.
    let error = post(&f.api, &uri, Some(r#"{"reason": "late"}"#))
        .await
        .refused(StatusCode::CONFLICT, "already_resolved");
    let expected = f
        .keiro
        .reject_awakeable(&awakeable, "late")
        .await
        .unwrap_err();
    assert_eq!(error, expected.to_string());

    // Unknown awakeables: 404.
    let unknown = format!("{}/0/7", f.done);
    let error = post(
        &f.api,
        &format!("/api/awakeables/{}/resolve", enc(&unknown)),
        Some("1"),
    )
    .await
    .refused(StatusCode::NOT_FOUND, "unknown_awakeable");
    let expected = f.keiro.resolve_awakeable_json(&unknown, json!(1)).await;
    assert_eq!(error, expected.unwrap_err().to_string());
}

async fn timer_pages_and_moves(backend: Backend) {
    let f = Fixture::new(backend).await;
    let timers = f.keiro.timers();
    let later = TimerRequest::after("t-later", "checkout", "order-1", Duration::from_secs(3600))
        .payload(json!({ "note": "<script>alert(1)</script>" }));
    keiro_tests::timers::schedule(&timers, later).await;
    keiro_tests::timers::dead(&timers, "t-dead", "gave up after 5 attempts").await;
    keiro_tests::timers::dead(&timers, "t-dead-2", "boom").await;

    let pending = get(&f.api, "/api/timers").await.ok();
    assert_eq!(pending["view"], "pending");
    assert_eq!(ids(&pending, "timers"), ["t-later"]);
    let timer = &pending["timers"][0];
    assert_eq!(timer["status"], "scheduled");
    assert_eq!(timer["process_manager"], "checkout");
    assert_eq!(timer["payload"]["note"], "<script>alert(1)</script>");
    let row = timers.get(&TimerId::new("t-later")).await.unwrap().unwrap();
    assert_eq!(*timer, keiro::admin::json::timer(&row));
    let dead = get(&f.api, "/api/timers?view=dead").await.ok();
    assert_eq!(ids(&dead, "timers"), ["t-dead", "t-dead-2"]);
    assert_eq!(dead["timers"][0]["last_error"], "gave up after 5 attempts");
    let stuck = get(&f.api, "/api/timers?view=stuck&older_than_secs=0")
        .await
        .ok();
    assert_eq!(stuck["timers"], json!([]));
    let filtered = get(&f.api, "/api/timers?view=pending&process_manager=other")
        .await
        .ok();
    assert_eq!(filtered["timers"], json!([]));
    // Paging.
    keiro_tests::timers::schedule(
        &timers,
        TimerRequest::after("t-later-2", "checkout", "o", Duration::from_secs(7200)),
    )
    .await;
    let first = get(&f.api, "/api/timers?limit=1").await.ok();
    assert_eq!(ids(&first, "timers"), ["t-later"]);
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = get(&f.api, &format!("/api/timers?limit=1&cursor={cursor}"))
        .await
        .ok();
    assert_eq!(ids(&second, "timers"), ["t-later-2"]);
    // Bad input.
    let error = get(&f.api, "/api/timers?view=soon")
        .await
        .refused(StatusCode::BAD_REQUEST, "invalid_view");
    assert!(error.contains("pending, stuck, dead"), "{error}");
    let error = get(&f.api, "/api/timers?cursor=garbage")
        .await
        .refused(StatusCode::BAD_REQUEST, "timer_malformed_cursor");
    let expected = TimerError::MalformedCursor {
        cursor: "garbage".into(),
    };
    assert_eq!(error, Error::from(expected).to_string());
    get(&f.api, "/api/timers?limit=0")
        .await
        .refused(StatusCode::BAD_REQUEST, "timer_invalid_page_limit");
    get(&f.api, &format!("/api/timers?view=dead&cursor={cursor}"))
        .await
        .refused(StatusCode::BAD_REQUEST, "timer_wrong_cursor_kind");

    // Resume takes only a dead timer; requeue a firing or dead one.
    let error = post(&f.api, "/api/timers/t-later/resume", None)
        .await
        .refused(StatusCode::CONFLICT, "timer_not_dead");
    let expected = TimerError::NotDead {
        id: "t-later".into(),
        status: TimerStatus::Scheduled,
    };
    assert_eq!(error, expected.to_string());
    let error = post(&f.api, "/api/timers/t-later/requeue", None)
        .await
        .refused(StatusCode::CONFLICT, "timer_not_applicable");
    assert_eq!(
        error,
        "timer `t-later` is scheduled; requeue takes a firing or dead timer, so nothing changed"
    );
    let resumed = post(&f.api, "/api/timers/t-dead/resume", None).await.ok();
    assert_eq!(resumed["outcome"], "resumed");
    assert_eq!(resumed["timer"]["id"], "t-dead");
    assert_eq!(resumed["timer"]["status"], "scheduled");
    assert_eq!(resumed["timer"]["attempts"], 0);
    post(&f.api, "/api/timers/t-dead/resume", None)
        .await
        .refused(StatusCode::CONFLICT, "timer_not_dead");
    let requeued = post(&f.api, "/api/timers/t-dead-2/requeue", None)
        .await
        .ok();
    assert_eq!(requeued["outcome"], "requeued");
    assert_eq!(requeued["timer"]["status"], "scheduled");
    let dead = get(&f.api, "/api/timers?view=dead").await.ok();
    assert_eq!(dead["timers"], json!([]));
    for route in ["requeue", "resume"] {
        let error = post(&f.api, &format!("/api/timers/nope/{route}"), None)
            .await
            .refused(StatusCode::NOT_FOUND, "timer_not_found");
        assert_eq!(error, "no timer has id `nope`");
    }
}

on_both_backends!(
    health_and_listing_with_filters_and_cursors,
    one_instance_with_its_steps_children_and_waits,
    operations_need_the_token,
    retry_through_the_api_runs_a_failed_instance_to_completion,
    cancel_resume_and_fork,
    awakeables_and_messages_from_outside,
    timer_pages_and_moves,
);
