//! `keiro list --version` and `--queue`, `keiro versions`, `keiro retarget` and the
//! pre-deploy `keiro check --binary-hashes`, run as the built binary on both
//! backends. Workflows are recorded by this test process; the command links
//! none of them.

use std::time::Duration;

use keiro::{step, workflow, Keiro};
use keiro_tests::{on_both_backends, Backend, TestDb};
use serde_json::Value;

on_both_backends!(
    list_by_version_versions_and_retarget,
    list_by_queue,
    show_names_queue_and_debounce_key,
    check_lists_exactly_the_instances_of_a_changed_workflow,
);

#[step]
async fn cli_v_step(key: String) -> String {
    key
}

#[workflow]
async fn cli_v_changed(key: String) -> String {
    cli_v_step(key).await
}

#[workflow]
async fn cli_v_kept(key: String) -> String {
    cli_v_step(key).await
}

keiro::queue!(CLI_PAYMENTS = "cli-payments", concurrency = 1);

/// What one run of the binary printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self, code: i32) -> Value {
        assert_eq!(self.code, code, "{self:#?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:#?}"))
    }
}

/// Runs the built `keiro` on `url` with `args`.
async fn keiro_cli(url: &str, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_keiro"))
        .args(args)
        .env("KEIRO_DATABASE_URL", url)
        .env_remove("KEIRO_EXECUTOR_ID")
        .env_remove(keiro::APP_VERSION_ENV)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("keiro finishes within 30 s")
        .expect("run the keiro binary");
    Run {
        code: output.status.code().expect("keiro exits, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn ids(items: &Value) -> Vec<String> {
    let mut ids: Vec<String> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

async fn enqueue(keiro: &Keiro, key: &str, changed: bool) {
    let call = if changed {
        cli_v_changed(key.to_owned())
    } else {
        cli_v_kept(key.to_owned())
    };
    call.id(key).on(keiro).enqueue().await.unwrap();
}

async fn list_by_version_versions_and_retarget(backend: Backend) {
    let db = TestDb::new(backend).await;
    let v1 = db.builder().app_version("v1").connect().await.unwrap();
    let v2 = db.builder().app_version("v2").connect().await.unwrap();
    cli_v_kept("done-1".into())
        .id("done-1")
        .on(&v1)
        .await
        .unwrap();
    enqueue(&v1, "wait-1", false).await;
    enqueue(&v2, "wait-2", false).await;

    let listed = keiro_cli(&db.url, &["list", "--version", "v1", "--json"]).await;
    assert_eq!(ids(&listed.json(0)["items"]), ["done-1", "wait-1"]);
    let item = &listed.json(0)["items"][0];
    assert_eq!(item["version"], "v1", "{item}");

    let versions = keiro_cli(&db.url, &["versions", "--json"]).await.json(0);
    assert_eq!(
        versions["items"],
        serde_json::json!([
            { "version": "v1", "unfinished": 1, "due": 1 },
            { "version": "v2", "unfinished": 1, "due": 1 },
        ])
    );
    let table = keiro_cli(&db.url, &["versions"]).await;
    assert_eq!(table.code, 0, "{table:#?}");
    assert!(table.stdout.starts_with("VERSION"), "{table:#?}");

    let moved = keiro_cli(
        &db.url,
        &["retarget", "--from", "v1", "--to", "v2", "--json"],
    )
    .await;
    assert_eq!(
        moved.json(0),
        serde_json::json!({ "from": "v1", "to": "v2", "moved": 1 })
    );
    let listed = keiro_cli(&db.url, &["list", "--version", "v2", "--json"]).await;
    assert_eq!(ids(&listed.json(0)["items"]), ["wait-1", "wait-2"]);
    // The finished one kept its version.
    let listed = keiro_cli(&db.url, &["list", "--version", "v1", "--json"]).await;
    assert_eq!(ids(&listed.json(0)["items"]), ["done-1"]);
    let human = keiro_cli(&db.url, &["retarget", "--from", "v1", "--to", "v2"]).await;
    assert_eq!(human.code, 0, "{human:#?}");
    assert!(
        human.stdout.starts_with("moved 0 unfinished instances"),
        "{human:#?}"
    );

    let bad = keiro_cli(&db.url, &["retarget", "--from", "v1", "--to", "two words"]).await;
    assert_eq!(bad.code, 1, "{bad:#?}");
    assert!(bad.stderr.contains("`two words`"), "{bad:#?}");
}

async fn check_lists_exactly_the_instances_of_a_changed_workflow(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // A finished instance of the changed workflow is never listed.
    cli_v_changed("finished".into())
        .id("finished")
        .on(&keiro)
        .await
        .unwrap();
    for key in ["changed-1", "changed-2"] {
        enqueue(&keiro, key, true).await;
    }
    enqueue(&keiro, "kept-1", false).await;
    let summary = keiro.summary("changed-1").await.unwrap();
    let ours = keiro::binary_hashes();
    assert_eq!(
        summary.skeleton_hash.as_ref(),
        ours.workflows.get("cli_v_changed"),
        "an instance records its workflow's skeleton hash"
    );
    assert_eq!(ours.app_version, keiro.app_version());
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, hashes: &keiro::BinaryHashes| {
        let path = dir.path().join(name);
        std::fs::write(&path, hashes.to_json()).unwrap();
        path.to_str().unwrap().to_owned()
    };

    // The same binary: nothing diverges.
    let same = write("same.json", &ours);
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", &same, "--json"]).await;
    let report = run.json(0);
    assert_eq!(report["diverging"], serde_json::json!([]), "{report}");
    assert_eq!(report["checked"], 3, "{report}");
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", &same]).await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("0 diverge"), "{run:#?}");

    // A new binary whose `cli_v_changed` has another skeleton.
    let mut new = ours.clone();
    new.workflows
        .insert("cli_v_changed".into(), "0000000000000000".into());
    let changed = write("changed.json", &new);
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", &changed, "--json"]).await;
    let report = run.json(3);
    assert_eq!(ids(&report["diverging"]), ["changed-1", "changed-2"]);
    let first = &report["diverging"][0];
    assert_eq!(first["reason"], "skeleton_changed", "{first}");
    assert_eq!(first["new_hash"], "0000000000000000", "{first}");
    assert_eq!(
        first["recorded_hash"],
        summary.skeleton_hash.unwrap().as_str()
    );
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", &changed]).await;
    assert_eq!(run.code, 3, "{run:#?}");
    assert!(run.stdout.starts_with("ID"), "{run:#?}");
    assert!(run.stdout.contains("changed-1") && !run.stdout.contains("kept-1"));

    // A new binary without `cli_v_kept`: its instance is listed.
    let mut new = ours.clone();
    new.workflows.remove("cli_v_kept");
    let missing = write("missing.json", &new);
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", &missing, "--json"]).await;
    let report = run.json(3);
    assert_eq!(ids(&report["diverging"]), ["kept-1"]);
    assert_eq!(report["diverging"][0]["reason"], "workflow_missing");

    // A malformed or absent file is refused, naming it.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"workflows\": 7}").unwrap();
    let bad = bad.to_str().unwrap();
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", bad]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains(bad), "{run:#?}");
    assert!(run.stdout.is_empty(), "{run:#?}");
    let absent = dir.path().join("absent.json");
    let absent = absent.to_str().unwrap();
    let run = keiro_cli(&db.url, &["check", "--binary-hashes", absent]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains(absent), "{run:#?}");
}

async fn list_by_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    for key in ["pay-1", "pay-2"] {
        cli_v_kept(key.into())
            .id(key)
            .on(&keiro)
            .queue(&CLI_PAYMENTS)
            .enqueue()
            .await
            .unwrap();
    }
    enqueue(&keiro, "plain-1", false).await;

    let listed = keiro_cli(&db.url, &["list", "--queue", "cli-payments", "--json"]).await;
    let items = &listed.json(0)["items"];
    assert_eq!(ids(items), ["pay-1", "pay-2"]);
    assert_eq!(items[0]["queue"], "cli-payments", "{items}");
    let listed = keiro_cli(&db.url, &["list", "--queue", "no-such-queue", "--json"]).await;
    assert_eq!(ids(&listed.json(0)["items"]), Vec::<String>::new());
    let listed = keiro_cli(&db.url, &["list", "--json"]).await;
    assert_eq!(ids(&listed.json(0)["items"]), ["pay-1", "pay-2", "plain-1"]);
}

/// `keiro show` names the queue an instance waits on and the debounce key
/// that enqueued it, in text and in JSON.
async fn show_names_queue_and_debounce_key(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let handle = cli_v_kept("burst".into())
        .on(&keiro)
        .queue(&CLI_PAYMENTS)
        .debounce("customer-7", Duration::from_secs(3600))
        .enqueue()
        .await
        .unwrap();
    let shown = keiro_cli(&db.url, &["show", handle.id(), "--json"]).await;
    let json = shown.json(0);
    assert_eq!(json["queue"], "cli-payments", "{json}");
    assert_eq!(json["debounce_key"], "customer-7", "{json}");
    let shown = keiro_cli(&db.url, &["show", handle.id()]).await;
    assert_eq!(shown.code, 0, "{shown:#?}");
    let line = |key: &str| {
        shown
            .stdout
            .lines()
            .find(|line| line.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no `{key}` line: {shown:#?}"))
            .to_owned()
    };
    assert!(line("queue").contains("cli-payments"), "{shown:#?}");
    assert!(line("debounce").contains("customer-7"), "{shown:#?}");
}
