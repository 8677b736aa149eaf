//! The built `keiro` binary against prepared databases, on both backends:
//! its output (tables within 100 columns, one JSON document with `--json`),
//! its exit codes (0 done, 1 refused / unknown / store error, 2 bad usage)
//! and what each repair command changes in the rows. Workflows run in this
//! test process; the command links none of them and runs nothing.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use keiro::timers::{TimerRequest, TimerStatus};
use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::operator::{set_aside, Switches};
use keiro_tests::timers::{dead, row as timer_row, schedule, timers};
use keiro_tests::{count, on_both_backends, ran, runs, Backend, TestDb};
use serde_json::Value;

on_both_backends!(
    list_pages_filters_and_refuses_bad_input,
    show_prints_the_summary_and_the_timeline,
    show_history_writes_a_history,
    connecting_needs_a_reachable_migrated_database,
    cancel_retry_resume_and_fork_change_the_rows,
    answers_and_messages_make_instances_due,
    timers_pages_and_repairs,
    gc_dry_run_then_real,
    schedules_list_pause_resume_and_trigger,
);

// ---------------------------------------------------------------- workflows

/// Keys whose `cli_crash` run panics after its first step.
static CRASHING: Switches = Switches::new();

#[step]
async fn cli_mark(key: String, n: u32) -> u32 {
    ran(&key, &format!("step {n}"));
    n
}

/// Three steps, journaled at seq 0, 1 and 2.
#[workflow]
async fn cli_steps(key: String) -> u32 {
    cli_mark(key.clone(), 1).await + cli_mark(key.clone(), 2).await + cli_mark(key, 3).await
}

/// One step, then a crash while `CRASHING` is on for `key`, then a second step.
#[workflow]
async fn cli_crash(key: String) -> u32 {
    let first = cli_mark(key.clone(), 1).await;
    if CRASHING.is_on(&key) {
        panic!("crash after step 1 of {key}");
    }
    first + cli_mark(key, 2).await
}

#[step]
async fn cli_hand_out(key: String, awakeable_id: String) -> bool {
    ran(&key, &format!("awakeable {awakeable_id}"));
    true
}

/// Waits on an awakeable whose id it hands out through the run log.
#[workflow]
async fn cli_wait(key: String) -> Result<String, String> {
    let answer = keiro::awakeable::<bool>().await;
    cli_hand_out(key, answer.id().to_string()).await;
    match answer.await {
        Ok(approved) => Ok(format!("answered {approved}")),
        Err(error) => Err(error.to_string()),
    }
}

/// Waits for a message on topic `greeting`.
#[workflow]
async fn cli_mailbox(_key: String) -> Result<String, String> {
    keiro::recv::<String>("greeting")
        .await
        .map_err(|e| e.to_string())
}

// ------------------------------------------------------------------ fixture

/// A database with one instance in each interesting state, and the
/// runtime (in this process) that runs them.
struct Fixture {
    db: TestDb,
    keiro: Keiro,
    /// Completed `cli_steps`.
    done: String,
    /// `cli_crash`, failed after its crash attempt.
    crashed: String,
    /// Two `cli_wait`, suspended on their awakeables.
    waiting: [String; 2],
    /// `cli_mailbox`, suspended on its message.
    mailbox: String,
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
            done: key("done"),
            crashed: key("crash"),
            waiting: [key("wait-a"), key("wait-b")],
            mailbox: key("mail"),
            db,
            keiro,
        };
        let keiro = &fixture.keiro;
        let done = &fixture.done;
        assert_eq!(cli_steps(done.clone()).id(done).on(keiro).await.unwrap(), 6);
        CRASHING.set(&fixture.crashed, true);
        let c = &fixture.crashed;
        cli_crash(c.clone())
            .id(c)
            .on(keiro)
            .enqueue()
            .await
            .unwrap();
        for w in &fixture.waiting {
            cli_wait(w.clone()).id(w).on(keiro).enqueue().await.unwrap();
        }
        let m = &fixture.mailbox;
        cli_mailbox(m.clone())
            .id(m)
            .on(keiro)
            .enqueue()
            .await
            .unwrap();
        let summary = keiro.resume_once(&quiet()).await.unwrap();
        assert_eq!(
            (summary.failed, summary.still_suspended),
            (1, 3),
            "{summary:?}"
        );
        fixture
    }

    /// Runs the built `keiro` with `args` on this database.
    async fn keiro_cmd(&self, args: &[&str]) -> Run {
        run(Some(&self.db.url), args).await
    }

    async fn status(&self, id: &str) -> WorkflowStatus {
        self.keiro
            .handle::<Value>(id)
            .await
            .unwrap()
            .status()
            .await
            .unwrap()
    }

    /// The awakeable id `cli_wait` instance `key` handed out.
    fn awakeable_of(&self, key: &str) -> String {
        runs(key)
            .iter()
            .find_map(|line| line.strip_prefix("awakeable ").map(str::to_owned))
            .unwrap_or_else(|| panic!("{key} handed out no awakeable"))
    }
}

/// What one run of the binary printed and how it exited.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts a clean exit and returns the output.
    fn ok(self) -> String {
        assert_eq!(self.code, 0, "{self:#?}");
        assert!(self.stderr.is_empty(), "{self:#?}");
        self.stdout
    }

    /// Asserts a clean exit and parses the one JSON document printed.
    fn json(self) -> Value {
        let out = self.ok();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON document ({e}): {out}"))
    }

    /// Asserts exit code `code` with nothing on stdout; returns stderr.
    fn fails(self, code: i32) -> String {
        assert_eq!(self.code, code, "{self:#?}");
        assert!(self.stdout.is_empty(), "{self:#?}");
        self.stderr
    }
}

/// Runs the built `keiro` with `args`, the database given through
/// `KEIRO_DATABASE_URL` (none at all when `url` is `None`).
async fn run(url: Option<&str>, args: &[&str]) -> Run {
    run_with_env(url, args, &[]).await
}

/// [`run`] with the environment variables `env` set.
async fn run_with_env(url: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_keiro"));
    command
        .args(args)
        .envs(env.iter().copied())
        .env_remove("KEIRO_DATABASE_URL")
        .env_remove("KEIRO_EXECUTOR_ID");
    if let Some(url) = url {
        command.env("KEIRO_DATABASE_URL", url);
    }
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("keiro finishes within 30 s")
        .expect("run the keiro binary");
    Run {
        code: output.status.code().expect("keiro exits, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn ids_of(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The line of `text` starting with `label`.
fn line_of<'t>(text: &'t str, label: &str) -> &'t str {
    text.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{text}"))
}

fn assert_fits(text: &str) {
    for line in text.lines() {
        assert!(
            line.chars().count() <= 100,
            "wider than 100 columns: {line}"
        );
    }
}

/// How many executor rows the database holds.
async fn executor_rows(fixture: &Fixture) -> i64 {
    let view = fixture.keiro.store();
    if let Some(pool) = view.sqlite_pool() {
        return sqlx::query_scalar("SELECT COUNT(*) FROM keiro_executors")
            .fetch_one(pool)
            .await
            .unwrap();
    }
    sqlx::query_scalar("SELECT COUNT(*) FROM keiro.executors")
        .fetch_one(view.postgres_pool().unwrap())
        .await
        .unwrap()
}

/// Forgets the queues the fixture's resume worker registered, as if it had
/// stopped cleanly.
async fn forget_registered_queues(fixture: &Fixture) {
    let view = fixture.keiro.store();
    if let Some(pool) = view.sqlite_pool() {
        sqlx::query("DELETE FROM keiro_worker_queues")
            .execute(pool)
            .await
            .unwrap();
    } else {
        sqlx::query("DELETE FROM keiro.worker_queues")
            .execute(view.postgres_pool().unwrap())
            .await
            .unwrap();
    }
}

// -------------------------------------------------------------------- tests

async fn list_pages_filters_and_refuses_bad_input(backend: Backend) {
    let f = Fixture::new(backend).await;
    let all: BTreeSet<String> = [
        &f.done,
        &f.crashed,
        &f.waiting[0],
        &f.waiting[1],
        &f.mailbox,
    ]
    .into_iter()
    .cloned()
    .collect();

    let table = f.keiro_cmd(&["list"]).await.ok();
    assert_fits(&table);
    let header = table.lines().next().unwrap();
    for column in ["ID", "NAME", "STATUS", "ATT", "CHANGED", "DETAIL"] {
        assert!(header.contains(column), "{header}");
    }
    assert_eq!(table.lines().count(), 1 + all.len(), "{table}");
    let crash_line = table
        .lines()
        .find(|l| l.starts_with(&f.crashed))
        .unwrap_or_else(|| panic!("no {} row:\n{table}", f.crashed));
    assert!(
        crash_line.contains("cli_crash") && crash_line.contains("failed"),
        "{crash_line}"
    );
    assert!(
        crash_line.contains("crash after step 1"),
        "the error is shown: {crash_line}"
    );
    assert!(!table.contains("more:"), "one page: {table}");
    let mail_line = table.lines().find(|l| l.starts_with(&f.mailbox)).unwrap();
    assert!(
        mail_line.contains("awaits a message on `greeting`"),
        "{mail_line}"
    );

    let page = f.keiro_cmd(&["list", "--json"]).await.json();
    assert_eq!(ids_of(&page).into_iter().collect::<BTreeSet<_>>(), all);
    assert!(page["next_cursor"].is_null());
    let done = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == f.done.as_str())
        .unwrap();
    assert_eq!(done["name"], "cli_steps");
    assert_eq!(done["status"], "completed");
    assert!(
        done["created_at"].as_str().unwrap().ends_with('Z'),
        "{done}"
    );

    // Filters.
    let failed = f
        .keiro_cmd(&["list", "--status", "failed", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&failed), [f.crashed.as_str()]);
    let two = f
        .keiro_cmd(&["list", "--status", "completed,failed", "--json"])
        .await
        .json();
    assert_eq!(
        ids_of(&two).into_iter().collect::<BTreeSet<_>>(),
        [f.done.clone(), f.crashed.clone()].into_iter().collect()
    );
    let waits = f
        .keiro_cmd(&["list", "--name", "cli_wait", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&waits).len(), 2);
    let prefix = f
        .keiro_cmd(&["list", "--prefix", "mail-", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&prefix), [f.mailbox.as_str()]);
    let recent = f
        .keiro_cmd(&["list", "--since", "1h", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&recent).len(), all.len());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let none = f.keiro_cmd(&["list", "--since", "1s"]).await.ok();
    assert_eq!(none, "no workflow instances match\n");

    // Paging: two rows a page, following the cursor, in both orders.
    for order in [None, Some("--oldest-first")] {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..10 {
            let mut args = vec!["list", "--limit", "2", "--json"];
            args.extend(order);
            if let Some(c) = &cursor {
                args.extend(["--cursor", c.as_str()]);
            }
            let page = f.keiro_cmd(&args).await.json();
            let ids = ids_of(&page);
            assert!(ids.len() <= 2);
            seen.extend(ids);
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen.len(), all.len(), "every row once: {seen:?}");
        assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), all);
    }
    let first = f.keiro_cmd(&["list", "--limit", "2"]).await.ok();
    let hint = first.lines().last().unwrap();
    let cursor = hint.strip_prefix("more: add --cursor ").expect(hint);
    let second = f
        .keiro_cmd(&["list", "--limit", "2", "--cursor", cursor])
        .await
        .ok();
    assert_eq!(second.lines().count(), 1 + 2 + 1, "{second}");

    // A malformed cursor is refused (exit 1) naming it.
    let error = f
        .keiro_cmd(&["list", "--cursor", "not-a-cursor"])
        .await
        .fails(1);
    assert!(
        error.contains("invalid listing cursor `not-a-cursor`"),
        "{error}"
    );
    // With --json the refusal is one JSON document on stderr.
    let error = f
        .keiro_cmd(&["--json", "list", "--cursor", "not-a-cursor"])
        .await
        .fails(1);
    let document: serde_json::Value = serde_json::from_str(&error)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {error}"));
    assert_eq!(document["kind"], "refused", "{document}");
    assert_eq!(document["exit_code"], 1, "{document}");
    assert!(
        document["error"]
            .as_str()
            .is_some_and(|e| e.contains("invalid listing cursor `not-a-cursor`")),
        "{document}"
    );
    // One from the other order too.
    let error = f
        .keiro_cmd(&["list", "--oldest-first", "--cursor", cursor])
        .await
        .fails(1);
    assert!(error.contains("other order"), "{error}");

    // Bad usage exits 2.
    let error = f
        .keiro_cmd(&["list", "--status", "failed,broken"])
        .await
        .fails(2);
    assert!(error.contains("unknown status `broken`"), "{error}");
    assert!(
        error.contains("pending, running, suspended, completed, failed"),
        "{error}"
    );
    let error = f.keiro_cmd(&["list", "--limit", "0"]).await.fails(2);
    assert!(error.contains("--limit"), "{error}");
    f.keiro_cmd(&["list", "--limit", "1001"]).await.fails(2);
    let error = f
        .keiro_cmd(&["list", "--since", "yesterday"])
        .await
        .fails(2);
    assert!(error.contains("`yesterday` is not a duration"), "{error}");
    f.keiro_cmd(&["frobnicate"]).await.fails(2);
    // With --json, a line the parser refuses is one JSON document too.
    for line in [
        &["--json", "frobnicate"][..],
        &["--json", "list", "--limit", "0"][..],
        &["list", "--no-such-flag", "--json"][..],
    ] {
        let error = f.keiro_cmd(line).await.fails(2);
        let document: serde_json::Value = serde_json::from_str(&error)
            .unwrap_or_else(|e| panic!("{line:?}: not one JSON document ({e}): {error}"));
        assert_eq!(document["kind"], "usage", "{document}");
        assert_eq!(document["exit_code"], 2, "{document}");
        assert!(
            document["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{document}"
        );
    }
}

async fn show_prints_the_summary_and_the_timeline(backend: Backend) {
    let f = Fixture::new(backend).await;
    let text = f.keiro_cmd(&["show", &f.done]).await.ok();
    assert_fits(&text);
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in:\n{text}"))
            .to_owned()
    };
    assert!(line("id ").ends_with(&f.done));
    assert!(line("workflow").ends_with("cli_steps"));
    assert!(line("status").ends_with("completed"));
    assert!(line("input").contains(&f.done));
    assert!(line("output").ends_with('6'));
    assert!(line("updated").contains("after creation"));
    let timeline: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("SEQ")).collect();
    assert_eq!(timeline.len(), 4, "a header and three steps:\n{text}");
    let header: Vec<&str> = timeline[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["SEQ", "KIND", "NAME", "OUTCOME", "ATT", "TOOK", "AT", "VALUE"]
    );
    for (seq, value) in [(0, 1), (1, 2), (2, 3)] {
        let cells: Vec<&str> = timeline[seq + 1].split_whitespace().collect();
        assert_eq!(cells.len(), 8, "{cells:?}");
        let (seq, value) = (seq.to_string(), value.to_string());
        assert_eq!(cells[..5], [seq.as_str(), "step", "cli_mark", "ok", "1"]);
        assert!(cells[5].ends_with('s'), "a duration: {cells:?}");
        assert!(cells[6].starts_with('+'), "since creation: {cells:?}");
        assert_eq!(cells[7], value);
    }

    let json = f.keiro_cmd(&["show", &f.done, "--json"]).await.json();
    assert_eq!(json["id"], f.done.as_str());
    assert_eq!(json["status"], "completed");
    assert_eq!(json["output"], 6);
    assert_eq!(json["input"][0], f.done.as_str());
    let steps = json["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[2]["seq"], 2);
    assert_eq!(steps[2]["kind"], "step");
    assert_eq!(steps[2]["name"], "cli_mark");
    assert_eq!(steps[2]["outcome"], "ok");
    assert_eq!(steps[2]["value"], 3);
    assert_eq!(steps[2]["attempts"], 1);
    assert!(
        steps[2]["duration_ms"].as_f64().unwrap() >= 0.0,
        "{}",
        steps[2]
    );
    assert!(steps[2]["finished_at"].as_str().unwrap().ends_with('Z'));

    // A failed instance shows why; a waiting one its awakeable.
    let text = f.keiro_cmd(&["show", &f.crashed]).await.ok();
    assert!(
        text.contains("error") && text.contains("crash after step 1"),
        "{text}"
    );
    let json = f.keiro_cmd(&["--json", "show", &f.waiting[0]]).await.json();
    assert_eq!(json["status"], "suspended");
    assert_eq!(json["waiting_on"]["kind"], "awakeable");
    // The id to answer it with, as the workflow handed it out.
    let handed_out = f.awakeable_of(&f.waiting[0]);
    assert_eq!(json["awaited_awakeable_id"], handed_out.as_str());
    assert_eq!(json["steps"][0]["awakeable_id"], handed_out.as_str());
    let text = f.keiro_cmd(&["show", &f.waiting[0]]).await.ok();
    assert!(line_of(&text, "awakeable").ends_with(&handed_out), "{text}");
    assert_eq!(
        json["waiting_on"]["seq"], 1,
        "the answer's entry follows the creation"
    );
    let text = f.keiro_cmd(&["show", &f.mailbox]).await.ok();
    assert!(
        line_of(&text, "waits").contains("awaits a message on `greeting`"),
        "{text}"
    );
    let kinds: Vec<&str> = json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["awakeable", "step"]);

    let error = f.keiro_cmd(&["show", "no-such-instance"]).await.fails(1);
    assert!(
        error.contains("no workflow instance has id `no-such-instance`"),
        "{error}"
    );
}

async fn show_history_writes_a_history(backend: Backend) {
    let f = Fixture::new(backend).await;
    let out = f.keiro_cmd(&["show", &f.done, "--history"]).await.ok();
    let history = keiro::History::from_json(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (history.workflow.as_str(), history.id.as_str()),
        ("cli_steps", f.done.as_str())
    );
    assert_eq!(history.status, "completed");
    assert_eq!(history.output.as_ref().unwrap().get(), "6");
    let results: Vec<&str> = history.entries.iter().map(|e| e.result.get()).collect();
    assert_eq!(results, ["1", "2", "3"]);
    assert_eq!(
        history.to_json_pretty(),
        f.keiro.export(&f.done).await.unwrap().to_json_pretty(),
        "the command writes what keiro.export reads"
    );
    // With --json too, one document that reads as a history.
    let json = f
        .keiro_cmd(&["--json", "show", &f.waiting[0], "--history"])
        .await
        .ok();
    let history: keiro::History = serde_json::from_str(&json).unwrap();
    assert_eq!(history.status, "suspended");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("done.json");
    let file_arg = file.to_str().unwrap();
    let text = f
        .keiro_cmd(&["show", &f.done, "--history", "--out", file_arg])
        .await
        .ok();
    assert!(text.contains("3 journal entries"), "{text}");
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written, out);

    let usage = f
        .keiro_cmd(&["show", &f.done, "--out", file_arg])
        .await
        .fails(2);
    assert!(usage.contains("--history"), "{usage}");
    let error = f
        .keiro_cmd(&["show", "no-such-instance", "--history"])
        .await
        .fails(1);
    assert!(error.contains("`no-such-instance`"), "{error}");
}

async fn connecting_needs_a_reachable_migrated_database(backend: Backend) {
    // No URL at all: bad usage, saying how to give one.
    let error = run(None, &["list"]).await.fails(2);
    assert!(
        error.contains("--database") && error.contains("KEIRO_DATABASE_URL"),
        "{error}"
    );

    // Unreachable: exit 1 naming the URL without its password.
    let url = "postgres://operator:hunter2@127.0.0.1:1/keiro";
    let error = run(Some(url), &["list"]).await.fails(1);
    assert!(
        error.contains("postgres://operator:***@127.0.0.1:1/keiro"),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "{error}");
    let error = run(None, &["--database", "mysql://db/keiro", "list"])
        .await
        .fails(1);
    assert!(error.contains("mysql://db/keiro"), "{error}");

    // A fresh database (an empty PostgreSQL database, or no SQLite file):
    // nothing but `migrate` touches it.
    let db = TestDb::new(backend).await;
    let error = run(Some(&db.url), &["list"]).await.fails(1);
    assert!(error.contains("keiro migrate"), "{error}");
    if backend == Backend::Sqlite {
        let path = db.url.strip_prefix("sqlite:").unwrap();
        assert!(!std::path::Path::new(path).exists(), "no file was created");
    }
    let migrated = run(Some(&db.url), &["migrate"]).await.ok();
    assert!(migrated.starts_with("migrated "), "{migrated}");
    assert!(migrated.contains("to schema version"), "{migrated}");
    let again = run(Some(&db.url), &["migrate", "--json"]).await.json();
    assert_eq!(again["previous_version"], again["version"]);
    assert!(again["version"].as_i64().unwrap() >= 10, "{again}");
    assert_eq!(
        run(Some(&db.url), &["list"]).await.ok(),
        "no workflow instances match\n"
    );
}

async fn cancel_retry_resume_and_fork_change_the_rows(backend: Backend) {
    let f = Fixture::new(backend).await;
    let executors = executor_rows(&f).await;

    // retry: the crash-failed instance is put back in line, nothing more;
    // the worker here runs it, and its journaled step is not run again.
    CRASHING.set(&f.crashed, false);
    let out = f.keiro_cmd(&["retry", &f.crashed]).await.ok();
    assert!(
        out.contains("pending") && out.contains("cli_crash"),
        "{out}"
    );
    let row = f
        .keiro
        .store()
        .get_instance(&f.crashed)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status.as_str(), "pending");
    assert_eq!(
        (row.attempts, row.lease_owner),
        (0, None),
        "the command claimed nothing"
    );
    let summary = f.keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.completed, 1, "{summary:?}");
    assert_eq!(f.status(&f.crashed).await, WorkflowStatus::Completed);
    assert_eq!(
        (count(&f.crashed, "step 1"), count(&f.crashed, "step 2")),
        (1, 1)
    );
    let error = f.keiro_cmd(&["retry", &f.done]).await.fails(1);
    assert!(
        error.contains(&f.done) && error.contains("is completed"),
        "{error}"
    );
    let error = f.keiro_cmd(&["retry", "nobody"]).await.fails(1);
    assert!(error.contains("`nobody`"), "{error}");

    // cancel: a suspended instance; then again (nothing to do); unknown.
    let out = f.keiro_cmd(&["cancel", &f.waiting[1]]).await.ok();
    assert_eq!(out, format!("cancelled {}\n", f.waiting[1]));
    assert_eq!(f.status(&f.waiting[1]).await, WorkflowStatus::Cancelled);
    let again = f
        .keiro_cmd(&["cancel", &f.waiting[1], "--json"])
        .await
        .json();
    assert_eq!(again["already_finished"], "cancelled");
    f.keiro_cmd(&["cancel", "nobody"]).await.fails(1);

    // resume: only an instance set aside for non-determinism.
    let error = f.keiro_cmd(&["resume", &f.done]).await.fails(1);
    assert!(error.contains("not set aside"), "{error}");
    set_aside(&f.keiro, &f.waiting[0]).await;
    assert!(matches!(
        f.status(&f.waiting[0]).await,
        WorkflowStatus::NonDeterministic { .. }
    ));
    let listed = f
        .keiro_cmd(&["list", "--status", "nondeterministic", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&listed), [f.waiting[0].as_str()]);
    f.keiro_cmd(&["resume", &f.waiting[0]]).await.ok();
    assert!(!matches!(
        f.status(&f.waiting[0]).await,
        WorkflowStatus::NonDeterministic { .. }
    ));

    // fork: from step 1 (seq 1) of the completed three-step run, as a
    // chosen id; the worker here runs steps 2 and 3 only.
    let forked = format!("{}-forked", f.done);
    let json = f
        .keiro_cmd(&["fork", &f.done, "--from", "1", "--id", &forked, "--json"])
        .await
        .json();
    assert_eq!(
        (json["id"].as_str(), json["status"].as_str()),
        (Some(forked.as_str()), Some("pending"))
    );
    let copied = f.keiro_cmd(&["show", &forked, "--json"]).await.json();
    assert_eq!(copied["steps"].as_array().unwrap().len(), 1);
    f.keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(f.status(&forked).await, WorkflowStatus::Completed);
    let ran_steps: Vec<usize> = (1..=3)
        .map(|n| count(&f.done, &format!("step {n}")))
        .collect();
    assert_eq!(ran_steps, [1, 2, 2]);
    let error = f
        .keiro_cmd(&["fork", &f.done, "--from", "0", "--id", &forked])
        .await
        .fails(1);
    assert!(error.contains(&forked), "{error}");
    let out = f.keiro_cmd(&["fork", &f.done, "--from", "2"]).await.ok();
    assert!(out.contains(&format!("{}-fork-", f.done)), "{out}");
    f.keiro_cmd(&["fork", "nobody", "--from", "0"])
        .await
        .fails(1);
    f.keiro_cmd(&["fork", &f.done]).await.fails(2);

    // None of these commands registered an executor.
    assert_eq!(executor_rows(&f).await, executors);
}

async fn answers_and_messages_make_instances_due(backend: Backend) {
    let f = Fixture::new(backend).await;
    let [a, b] = [f.awakeable_of(&f.waiting[0]), f.awakeable_of(&f.waiting[1])];

    let out = f.keiro_cmd(&["resolve", &a, "true"]).await.ok();
    assert!(out.starts_with(&format!("resolved awakeable {a}")), "{out}");
    let row = f
        .keiro
        .store()
        .get_instance(&f.waiting[0])
        .await
        .unwrap()
        .unwrap();
    let now_us = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        row.wake_at.is_some_and(|at| at <= now_us),
        "due now: {row:?}"
    );
    let error = f.keiro_cmd(&["resolve", &a, "false"]).await.fails(1);
    assert!(error.contains("already answered"), "{error}");

    f.keiro_cmd(&["reject", &b, "over budget"]).await.ok();
    let error = f.keiro_cmd(&["resolve", &b, "not json"]).await.fails(2);
    assert!(error.contains("`not json` is not JSON"), "{error}");
    let error = f
        .keiro_cmd(&["resolve", "no/such/awakeable", "1"])
        .await
        .fails(1);
    assert!(
        error.contains("no awakeable has id `no/such/awakeable`"),
        "{error}"
    );

    let out = f
        .keiro_cmd(&["send", &f.mailbox, "greeting", "\"hello\""])
        .await
        .ok();
    assert_eq!(
        out,
        format!("sent \"hello\" on topic `greeting` to {}\n", f.mailbox)
    );
    let error = f
        .keiro_cmd(&["send", "nobody", "greeting", "1"])
        .await
        .fails(1);
    assert!(error.contains("`nobody`"), "{error}");
    let error = f
        .keiro_cmd(&["send", &f.done, "greeting", "1"])
        .await
        .fails(1);
    assert!(error.contains("has ended"), "{error}");

    // The worker here finishes all three with what the command gave them.
    let summary = f.keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.completed, 3, "{summary:?}");
    let result = |id: &str| {
        let keiro = f.keiro.clone();
        let id = id.to_owned();
        async move {
            keiro
                .handle::<Result<String, String>>(&id)
                .await
                .unwrap()
                .result()
                .await
                .unwrap()
        }
    };
    assert_eq!(result(&f.waiting[0]).await, Ok("answered true".to_owned()));
    let rejected = result(&f.waiting[1]).await.unwrap_err();
    assert!(rejected.contains("over budget"), "{rejected}");
    // Failed by returning its `Err`: the listing says where to read it.
    let failed = f.keiro_cmd(&["list", "--name", "cli_wait"]).await.ok();
    let line = line_of(&failed, &f.waiting[1]);
    assert!(
        line.contains("failed") && line.contains("returned Err"),
        "{failed}"
    );
    assert_eq!(result(&f.mailbox).await, Ok("hello".to_owned()));
}

async fn timers_pages_and_repairs(backend: Backend) {
    let db = TestDb::new(backend).await;
    let t = timers(&db).await;
    let later = SystemTime::now() + Duration::from_secs(3600);
    for (id, pm) in [("p-1", "checkout"), ("p-2", "checkout"), ("p-3", "billing")] {
        schedule(&t, TimerRequest::new(id, pm, format!("order-{id}"), later)).await;
    }
    dead(&t, "d-1", "gateway down").await;
    dead(&t, "d-2", "gateway down").await;
    let keiro = |args: &'static [&'static str]| run(Some(&db.url), args);

    let table = keiro(&["timers", "pending"]).await.ok();
    assert_fits(&table);
    assert!(table.starts_with("ID"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");
    let page = keiro(&["timers", "pending", "--pm", "billing", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&page), ["p-3"]);
    let page = keiro(&["timers", "pending", "--limit", "2", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&page).len(), 2);
    assert!(page["next_cursor"].is_string());
    let dead_page = keiro(&["timers", "dead", "--json"]).await.json();
    assert_eq!(ids_of(&dead_page), ["d-1", "d-2"]);
    assert_eq!(dead_page["items"][0]["last_error"], "gateway down");
    let table = keiro(&["timers", "dead"]).await.ok();
    assert!(table.contains("gateway down"), "{table}");

    // requeue a dead timer; cancel a pending one; resume a dead one.
    keiro(&["timers", "requeue", "d-1"]).await.ok();
    assert_eq!(timer_row(&t, "d-1").await.status, TimerStatus::Scheduled);
    let json = keiro(&["timers", "cancel", "p-1", "--json"]).await.json();
    assert_eq!(json["status"], "cancelled");
    assert_eq!(timer_row(&t, "p-1").await.status, TimerStatus::Cancelled);
    let out = keiro(&["timers", "resume", "d-2"]).await.ok();
    assert!(out.contains("timer d-2 is scheduled"), "{out}");
    let resumed = timer_row(&t, "d-2").await;
    assert_eq!(
        (resumed.status, resumed.attempts),
        (TimerStatus::Scheduled, 0)
    );

    // Refusals name the timer.
    let error = keiro(&["timers", "resume", "p-2"]).await.fails(1);
    assert!(
        error.contains("timer `p-2` is scheduled, not dead"),
        "{error}"
    );
    let error = keiro(&["timers", "cancel", "p-1"]).await.fails(1);
    assert!(error.contains("timer `p-1` is cancelled"), "{error}");
    let error = keiro(&["timers", "requeue", "nope"]).await.fails(1);
    assert!(error.contains("no timer has id `nope`"), "{error}");

    // A claim nobody finished is stuck.
    let claimed = t.claim_due().await.unwrap().expect("d-1 and d-2 are due");
    let stuck = keiro(&["timers", "stuck", "--older-than", "0s", "--json"])
        .await
        .json();
    assert_eq!(ids_of(&stuck), [claimed.id.to_string()]);
    let none = keiro(&["timers", "stuck"]).await.ok();
    assert_eq!(none, "no timers match\n", "claimed just now, not 5 min ago");
    let id = claimed.id.to_string();
    let out = run(Some(&db.url), &["timers", "requeue", &id]).await.ok();
    assert!(out.contains(&format!("timer {id} is scheduled")), "{out}");
    assert_eq!(timer_row(&t, &id).await.status, TimerStatus::Scheduled);
}

async fn gc_dry_run_then_real(backend: Backend) {
    let f = Fixture::new(backend).await;
    // Nothing finished an hour ago.
    let json = f
        .keiro_cmd(&["gc", "--finished-older-than", "1h", "--json"])
        .await
        .json();
    assert_eq!(
        (json["instances"].as_u64(), json["dry_run"].as_bool()),
        (Some(0), Some(false))
    );

    // The fixture's worker registered the test binary's queues, one with a
    // rate limit of 20 per second counted on finished instances: a shorter
    // retention is refused, naming it, though the command declares no queue.
    let error = f
        .keiro_cmd(&["gc", "--finished-older-than", "0s"])
        .await
        .fails(1);
    assert!(
        error.contains("queue `test-rate-20` (as a resume worker registered it)")
            && error.contains("20 per 1s"),
        "{error}"
    );
    forget_registered_queues(&f).await;

    // Completed ones at once, failed ones after an hour: a dry run counts
    // the completed three-step instance and deletes nothing.
    let age = ["--finished-older-than", "0s", "--failed-older-than", "1h"];
    let dry: Vec<&str> = ["gc", "--dry-run"].into_iter().chain(age).collect();
    let counted = f
        .keiro_cmd(&[dry.as_slice(), &["--json"]].concat())
        .await
        .json();
    assert_eq!(counted["dry_run"], true);
    assert_eq!(
        (counted["instances"].as_u64(), counted["steps"].as_u64()),
        (Some(1), Some(3))
    );
    f.keiro_cmd(&["show", &f.done]).await.ok();
    let text = f.keiro_cmd(&dry).await.ok();
    assert!(text.starts_with("dry run: nothing was deleted"), "{text}");
    assert_fits(&text);

    let real: Vec<&str> = ["gc"].into_iter().chain(age).collect();
    let text = f.keiro_cmd(&real).await.ok();
    assert!(text.starts_with("deleted\n"), "{text}");
    let instances = text
        .lines()
        .find(|l| l.trim_start().starts_with("instances"))
        .unwrap();
    assert!(instances.ends_with(" 1"), "{text}");
    f.keiro_cmd(&["show", &f.done]).await.fails(1);
    // The failed one is younger than its hour; nothing unfinished goes.
    let left = f.keiro_cmd(&["list", "--json"]).await.json();
    let left: BTreeSet<String> = ids_of(&left).into_iter().collect();
    let expected: BTreeSet<String> = [&f.crashed, &f.waiting[0], &f.waiting[1], &f.mailbox]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(left, expected);
    // Counted as the dry run said; a second run finds nothing.
    let again = f
        .keiro_cmd(&[real.as_slice(), &["--json"]].concat())
        .await
        .json();
    assert_eq!(again["instances"], 0);

    let error = f
        .keiro_cmd(&["gc", "--finished-older-than", "30d", "--batch-size", "0"])
        .await
        .fails(2);
    assert!(error.contains("--batch-size"), "{error}");
    let error = f.keiro_cmd(&["gc"]).await.fails(2);
    assert!(error.contains("--finished-older-than"), "{error}");
    let error = f
        .keiro_cmd(&["gc", "--finished-older-than", "30 days"])
        .await
        .fails(2);
    assert!(error.contains("`30 days` is not a duration"), "{error}");
}

async fn schedules_list_pause_resume_and_trigger(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    keiro
        .create_schedule("nightly-mark", "0 0 2 * * *", cli_steps("sched".into()))
        .await
        .unwrap();
    let cmd = |args: &'static [&'static str]| run(Some(&db.url), args);

    let table = cmd(&["schedules"]).await.ok();
    assert_fits(&table);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("nightly-mark") && table.contains("0 0 2 * * *") && table.contains("active"),
        "{table}"
    );
    cmd(&["schedules", "pause", "nightly-mark"]).await.ok();
    let listed = cmd(&["schedules", "--json"]).await.json();
    assert_eq!(listed[0]["name"], "nightly-mark");
    assert_eq!(listed[0]["paused"], true);
    assert!(listed[0]["next_tick"].is_null(), "{listed}");
    cmd(&["schedules", "resume", "nightly-mark"]).await.ok();
    let listed = cmd(&["schedules", "--json"]).await.json();
    assert_eq!(listed[0]["paused"], false);
    assert!(listed[0]["next_tick"].is_string(), "{listed}");

    let triggered = cmd(&["schedules", "trigger", "nightly-mark", "--json"])
        .await
        .json();
    let id = triggered["id"].as_str().unwrap();
    assert!(id.starts_with("cron:nightly-mark:trigger:"), "{triggered}");
    let handle = keiro.handle::<u32>(id).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Pending);

    let err = cmd(&["schedules", "pause", "nope"]).await.fails(1);
    assert!(
        err.contains("`nope`") && err.contains("nightly-mark"),
        "{err}"
    );
}

/// PostgreSQL: `keiro schedules resume` run on a host whose clock is 8 s
/// ahead (the command takes no executor identity, so nothing checks that
/// clock) judges which ticks fell by the database server's: 3 s after a
/// tick of a schedule every 10 s, its own clock reads past the next tick,
/// which must not be passed over as fallen while paused. A worker then
/// runs it when it falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_resume_from_a_clock_ahead_passes_over_no_tick_to_come() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    keiro
        .create_schedule(
            "every10-cli",
            "*/10 * * * * *",
            cli_steps("every10-cli".into()),
        )
        .await
        .unwrap();
    keiro.pause_schedule("every10-cli").await.unwrap();
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let millis = || {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    // 3 s after a tick (the clock 8 s ahead reads 1 s past the next).
    let mut now = millis();
    while now % 10_000 < 3_000 || now % 10_000 > 3_500 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = millis();
    }
    let next_tick_ms = now - now % 10_000 + 10_000;
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+8s").unwrap();
    let env = keiro_tests::faketime::shifted_env(&offset);
    run_with_env(Some(&db.url), &["schedules", "resume", "every10-cli"], &env)
        .await
        .ok();
    assert!(
        millis() < next_tick_ms,
        "the resume ran past the next tick; the test's window is 6.5 s"
    );
    // The next tick falls, and the worker starts it.
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let ticks = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM keiro.workflows WHERE id LIKE 'cron:every10-cli:%' \
             AND id NOT LIKE '%:trigger:%'",
        )
        .fetch_one(&pool)
    };
    while millis() < next_tick_ms + 3_000 && ticks().await.unwrap() == 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ticks().await.unwrap(),
        1,
        "the tick after the resume was passed over as fallen while paused"
    );
    worker.stop().await;
}
