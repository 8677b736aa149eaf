//! Histories, replay tests and the pre-deploy check, on both backends:
//! `keiro.export(id)` writes an instance's input, every journal entry and
//! its outcome as a JSON document that reads back; that history replays
//! against the current code with no side effects
//! (`keiro::testing::replay`), passing on unchanged code and failing with
//! the expected/found diff a worker would set the instance aside with once
//! the code changed; `keiro.check()` lists exactly the unfinished instances
//! the new code diverges from.

use std::time::Duration;

use keiro::testing::replay;
use keiro::{
    step, workflow, Error, History, HistoryError, Keiro, ReplayError, ReplayStop, ResumeOptions,
    WorkflowStatus, HISTORY_FORMAT,
};
use keiro_tests::deployments::{deploy, version};
use keiro_tests::{count, create_pending, on_both_backends, ran, Backend, TestDb};

on_both_backends!(
    export_holds_input_every_entry_and_the_outcome,
    export_of_an_unknown_id_is_not_found,
    export_of_an_unfinished_instance_has_no_output,
    unchanged_code_replays_without_running_a_step,
    an_inserted_step_fails_with_the_diff,
    a_removed_step_fails_as_returning_early,
    an_unfinished_history_stops_at_its_end,
    a_history_of_another_workflow_is_refused,
    a_child_the_history_has_not_recorded_is_not_started,
    check_lists_exactly_the_diverging_unfinished_instance,
    a_transactional_step_beyond_the_history_does_not_run,
    check_does_not_run_a_transactional_step,
);

#[step]
async fn r_add(key: String, n: u32) -> u32 {
    ran(&key, "add");
    n + 1
}

#[step]
async fn r_refuse(key: String) -> Result<u32, String> {
    ran(&key, "refuse");
    Err(format!("no stock for {key}"))
}

#[step]
async fn r_audit(key: String) -> bool {
    ran(&key, "audit");
    true
}

/// Four entries in version 1: a step, a journaled clock, a step's `Err`, a
/// step. Version 2 inserts `r_audit` after the first step; version 3 drops
/// the last step.
#[workflow]
async fn r_order(key: String, qty: u32) -> Result<u32, String> {
    let a = r_add(key.clone(), qty).await;
    if version(&key) == 2 {
        r_audit(key.clone()).await;
    }
    keiro::now().await;
    let refused = r_refuse(key.clone()).await.is_err();
    if version(&key) == 3 {
        return Ok(a);
    }
    let b = r_add(key, a).await;
    Ok(b + u32::from(refused))
}

/// The same arguments as `r_order`, another workflow.
#[workflow]
async fn r_other(key: String, qty: u32) -> u32 {
    r_add(key, qty).await
}

/// A step, then a message on `go`, then a step. Version 2 audits first.
#[workflow]
async fn r_gate(key: String) -> bool {
    if version(&key) == 2 {
        r_audit(key.clone()).await;
    }
    r_add(key.clone(), 0).await;
    let go = keiro::recv::<bool>("go").await.unwrap_or(false);
    r_add(key, 1).await;
    go
}

/// A step, then a child workflow.
#[workflow]
async fn r_parent(key: String) -> Result<u32, String> {
    let n = r_add(key.clone(), 0).await;
    r_other(key, n).await.map_err(|e| e.to_string())
}

/// A transactional step that records each run of its body (and writes
/// nothing: a replay's private database holds no application table).
#[step(transaction)]
async fn r_write(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    let _ = tx;
    ran(&key, "write");
    Ok(1)
}

/// A step, then a transactional step.
#[workflow]
async fn r_pay(key: String) -> Result<u32, String> {
    let n = r_add(key.clone(), 0).await;
    Ok(n + r_write(key).await?)
}

/// A transactional step first.
#[workflow]
async fn r_pay_first(key: String) -> Result<u32, String> {
    r_write(key).await
}

async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .suspend_after(Duration::from_millis(20))
        .connect()
        .await
        .unwrap()
}

fn key() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn wait_status(keiro: &Keiro, id: &str, wanted: &WorkflowStatus) -> WorkflowStatus {
    let mut status = None;
    for _ in 0..500 {
        let now = keiro.summary(id).await.unwrap().status;
        if std::mem::discriminant(&now) == std::mem::discriminant(wanted) {
            return now;
        }
        status = Some(now);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} is {status:?}, not {wanted:?}");
}

/// A runtime on `db` with a finished `r_order` (version 1) and its history.
async fn recorded_order(db: &TestDb) -> (Keiro, String, History) {
    let keiro = runtime(db).await;
    let key = key();
    let out = r_order(key.clone(), 7).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(10));
    let history = keiro.export(&key).await.unwrap();
    (keiro, key, history)
}

/// Starts `r_gate` for `key` and waits for it to suspend on its message.
async fn gate_waiting(keiro: &Keiro, key: &str) {
    r_gate(key.to_owned())
        .id(key)
        .on(keiro)
        .start()
        .await
        .unwrap();
    wait_status(keiro, key, &WorkflowStatus::Suspended).await;
}

async fn export_holds_input_every_entry_and_the_outcome(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (keiro, key, history) = recorded_order(&db).await;
    assert_eq!(history.format, HISTORY_FORMAT);
    assert_eq!(history.workflow, "r_order");
    assert_eq!(history.id, key);
    assert_eq!(history.generation, 0);
    assert_eq!(history.status, "completed");
    assert_eq!(
        history.signature.as_deref(),
        Some("(String,u32)->Result<u32,String>")
    );
    let input: serde_json::Value = serde_json::from_str(history.input.get()).unwrap();
    assert_eq!(input, serde_json::json!([key, 7]));
    assert_eq!(history.output.as_ref().unwrap().get(), r#"{"Ok":10}"#);
    assert_eq!(history.error, None);
    let shape: Vec<(i64, &str, &str)> = history
        .entries
        .iter()
        .map(|e| (e.seq, e.kind.as_str(), e.name.as_str()))
        .collect();
    assert_eq!(
        shape,
        [
            (0, "step", "r_add"),
            (1, "now", "now"),
            (2, "step", "r_refuse"),
            (3, "step", "r_add"),
        ]
    );
    assert_eq!(history.entries[0].result.get(), "8");
    assert_eq!(
        history.entries[2].result.get(),
        format!(r#"{{"Err":"no stock for {key}"}}"#)
    );
    assert_eq!(history.entries[3].result.get(), "9");
    for entry in [&history.entries[0], &history.entries[2]] {
        assert_eq!(entry.attempts, Some(1), "{entry:?}");
        assert!(
            entry.started_at_us.unwrap() <= entry.recorded_at_us,
            "{entry:?}"
        );
    }
    assert_eq!(history.entries[1].attempts, None);
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    for (entry, row) in history.entries.iter().zip(&journal) {
        assert_eq!(
            entry.result.get(),
            row.result,
            "entry {} as journaled",
            entry.seq
        );
    }

    // Through JSON text and back: the same document.
    let text = history.to_json_pretty();
    let read = History::from_json(&text).unwrap();
    assert_eq!(read.to_json_pretty(), text);
    let compact = serde_json::to_string(&history).unwrap();
    let read: History = serde_json::from_str(&compact).unwrap();
    assert_eq!(serde_json::to_string(&read).unwrap(), compact);
    assert_eq!(read.entries.len(), 4);

    // Another format version, or a malformed shape, is refused saying so.
    let mut document: serde_json::Value = serde_json::from_str(&text).unwrap();
    document["format"] = 99.into();
    let error = History::from_json(&document.to_string()).unwrap_err();
    assert!(
        matches!(error, HistoryError::UnknownFormat { found: 99 }),
        "{error:?}"
    );
    assert!(error.to_string().contains("format 99"), "{error}");
    let error = serde_json::from_str::<History>(&document.to_string()).unwrap_err();
    assert!(error.to_string().contains("format 99"), "{error}");
    let mut document: serde_json::Value = serde_json::from_str(&text).unwrap();
    document["entries"][0]
        .as_object_mut()
        .unwrap()
        .remove("kind");
    let error = History::from_json(&document.to_string()).unwrap_err();
    assert!(matches!(error, HistoryError::Malformed(_)), "{error:?}");
    assert!(
        error.to_string().contains("missing field `kind`"),
        "{error}"
    );
    let mut document: serde_json::Value = serde_json::from_str(&text).unwrap();
    document["entries"][1]["seq"] = 0.into();
    let error = History::from_json(&document.to_string()).unwrap_err();
    assert!(
        error.to_string().contains("increasing seq order"),
        "{error}"
    );
    let mut document: serde_json::Value = serde_json::from_str(&text).unwrap();
    document["status"] = "finished".into();
    let error = History::from_json(&document.to_string()).unwrap_err();
    assert!(
        error.to_string().contains("unknown status `finished`"),
        "{error}"
    );
    let error = History::from_json("[1, 2]").unwrap_err();
    assert!(
        error.to_string().starts_with("not a keiro history"),
        "{error}"
    );
}

async fn export_of_an_unknown_id_is_not_found(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let error = keiro.export("no-such-instance").await.unwrap_err();
    assert!(
        matches!(&error, Error::NotFound { id } if id == "no-such-instance"),
        "{error:?}"
    );
    assert!(error.to_string().contains("`no-such-instance`"), "{error}");
}

async fn export_of_an_unfinished_instance_has_no_output(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = key();
    gate_waiting(&keiro, &key).await;
    let history = keiro.export(&key).await.unwrap();
    assert_eq!(history.status, "suspended");
    assert!(history.output.is_none());
    let kinds: Vec<&str> = history.entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["step"]);
}

async fn unchanged_code_replays_without_running_a_step(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (keiro, key, history) = recorded_order(&db).await;
    let (adds, refusals) = (count(&key, "add"), count(&key, "refuse"));
    assert_eq!((adds, refusals), (2, 1));

    let replayed = replay(&history, r_order).await.unwrap();
    assert_eq!((replayed.matched, replayed.entries), (4, 4));
    assert_eq!(
        replayed.stop,
        ReplayStop::Returned {
            output: serde_json::json!({ "Ok": 10 }),
            matches_history: Some(true),
        }
    );
    assert!(replayed.output_matches());
    // A fixture read back from its file replays the same way.
    let fixture = keiro::History::from_json(&history.to_json_pretty()).unwrap();
    assert!(replay(&fixture, r_order).await.unwrap().output_matches());
    assert_eq!(
        (count(&key, "add"), count(&key, "refuse")),
        (adds, refusals),
        "a replay ran a step body"
    );
    assert_eq!(
        keiro.summary(&key).await.unwrap().status,
        WorkflowStatus::Completed
    );
    assert_eq!(
        keiro.steps(&key).await.unwrap().len(),
        4,
        "the journal is untouched"
    );
}

async fn an_inserted_step_fails_with_the_diff(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (keiro, key, history) = recorded_order(&db).await;
    deploy(&key, 2);
    let error = replay(&history, r_order).await.unwrap_err();
    let divergence = error.divergence().unwrap_or_else(|| panic!("{error}"));
    assert_eq!(divergence.seq, 1);
    assert_eq!(divergence.expected, "keiro::now() `now`");
    assert_eq!(divergence.found, "step `r_audit`");
    assert_eq!(
        (divergence.workflow.as_str(), divergence.id.as_str()),
        ("r_order", key.as_str())
    );
    let text = error.to_string();
    assert!(
        text.contains("diverges at step 1: the history recorded keiro::now() `now` but the code now calls step `r_audit`"),
        "{text}"
    );
    assert_eq!(count(&key, "audit"), 0, "a replay ran a step body");

    // The same diff a worker sets an instance aside with: record an
    // instance on version 1, change the code while it waits, let it resume.
    let gate = self::key();
    gate_waiting(&keiro, &gate).await;
    let waiting = keiro.export(&gate).await.unwrap();
    replay(&waiting, r_gate).await.unwrap();
    deploy(&gate, 2);
    let diff = replay(&waiting, r_gate).await.unwrap_err();
    let diff = diff.divergence().expect("a divergence").clone();
    keiro.send(&gate, "go", &true).await.unwrap();
    keiro
        .resume_once(&ResumeOptions::default().log(|_| {}))
        .await
        .unwrap();
    let set_aside = wait_status(
        &keiro,
        &gate,
        &WorkflowStatus::NonDeterministic {
            expected: String::new(),
            found: String::new(),
        },
    )
    .await;
    assert_eq!(
        set_aside,
        WorkflowStatus::NonDeterministic {
            expected: diff.expected.clone(),
            found: diff.found.clone(),
        }
    );
    assert_eq!(
        (diff.expected.as_str(), diff.found.as_str()),
        ("step `r_add`", "step `r_audit`")
    );
}

async fn a_removed_step_fails_as_returning_early(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_keiro, key, history) = recorded_order(&db).await;
    deploy(&key, 3);
    let error = replay(&history, r_order).await.unwrap_err();
    let divergence = error.divergence().unwrap_or_else(|| panic!("{error}"));
    assert_eq!(divergence.seq, 3);
    assert_eq!(divergence.expected, "step `r_add`");
    assert_eq!(divergence.found, "the workflow returning before it");
}

async fn an_unfinished_history_stops_at_its_end(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = key();
    gate_waiting(&keiro, &key).await;
    let history = keiro.export(&key).await.unwrap();
    assert_eq!(history.entries.len(), 1);
    let adds = count(&key, "add");
    let replayed = replay(&history, r_gate).await.unwrap();
    assert_eq!(replayed.stop, ReplayStop::HistoryEnd);
    assert_eq!((replayed.matched, replayed.entries), (1, 1));
    assert!(!replayed.output_matches());

    // Answered: the history now holds the message, and the replay stops
    // where the code would run the last step, without running it.
    keiro.send(&key, "go", &true).await.unwrap();
    keiro
        .resume_once(&ResumeOptions::default().log(|_| {}))
        .await
        .unwrap();
    wait_status(&keiro, &key, &WorkflowStatus::Completed).await;
    let adds_after = count(&key, "add");
    assert_eq!(adds_after, adds + 1);
    let mut history = keiro.export(&key).await.unwrap();
    assert_eq!(history.entries.len(), 3);
    history.entries.pop();
    history.output = None;
    let replayed = replay(&history, r_gate).await.unwrap();
    assert_eq!(replayed.stop, ReplayStop::HistoryEnd);
    assert_eq!(replayed.matched, 2);
    assert_eq!(count(&key, "add"), adds_after, "a replay ran a step body");
}

async fn a_history_of_another_workflow_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (_keiro, _key, history) = recorded_order(&db).await;
    let error = replay(&history, r_other).await.unwrap_err();
    assert!(
        matches!(&error, ReplayError::OtherWorkflow { history, code, .. } if history == "r_order" && code == "r_other"),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("is of workflow `r_order`, not of workflow `r_other`"),
        "{error}"
    );
    // One whose input does not fit the workflow's arguments says so.
    let error = replay(&history, r_gate).await.unwrap_err();
    assert!(matches!(error, ReplayError::Failed { .. }), "{error:?}");
    assert!(error.to_string().contains("argument types"), "{error}");
}

async fn check_lists_exactly_the_diverging_unfinished_instance(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let (changed, unchanged, finished) = (key(), key(), key());
    gate_waiting(&keiro, &changed).await;
    gate_waiting(&keiro, &unchanged).await;
    r_order(finished.clone(), 1)
        .id(&finished)
        .on(&keiro)
        .await
        .unwrap()
        .unwrap();
    create_pending(&keiro, "orphan-1", "linked_nowhere", "[]").await;
    let report = keiro.check().await.unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.checked, 2, "{report}");

    // The new code: `changed` and `finished` run version 2 now.
    deploy(&changed, 2);
    deploy(&finished, 2);
    let adds = count(&changed, "add") + count(&unchanged, "add");
    let report = keiro.check().await.unwrap();
    assert!(!report.is_ok());
    assert_eq!(report.checked, 2, "{report}");
    let diverging: Vec<_> = report
        .diverging
        .iter()
        .map(|d| {
            (
                d.id.as_str(),
                d.workflow.as_str(),
                d.seq,
                d.expected.as_str(),
                d.found.as_str(),
            )
        })
        .collect();
    assert_eq!(
        diverging,
        [(
            changed.as_str(),
            "r_gate",
            0,
            "step `r_add`",
            "step `r_audit`"
        )],
        "{report}"
    );
    assert!(report.failed.is_empty(), "{report}");
    let unregistered: Vec<_> = report
        .unregistered
        .iter()
        .map(|u| (u.id.as_str(), u.workflow.as_str()))
        .collect();
    assert_eq!(unregistered, [("orphan-1", "linked_nowhere")]);
    let text = report.to_string();
    assert!(
        text.contains(&changed) && text.contains("orphan-1"),
        "{text}"
    );
    assert!(!text.contains(&unchanged), "{text}");
    assert_eq!(count(&changed, "audit"), 0, "the check ran a step body");
    assert_eq!(count(&changed, "add") + count(&unchanged, "add"), adds);
    // Nothing changed in the store: both still wait.
    for id in [&changed, &unchanged] {
        assert_eq!(
            keiro.summary(id).await.unwrap().status,
            WorkflowStatus::Suspended
        );
    }
}

async fn a_child_the_history_has_not_recorded_is_not_started(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = key();
    assert_eq!(
        r_parent(key.clone()).id(&key).on(&keiro).await.unwrap(),
        Ok(2)
    );
    let mut history = keiro.export(&key).await.unwrap();
    let kinds: Vec<&str> = history.entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["step", "child"]);
    assert!(replay(&history, r_parent).await.unwrap().output_matches());
    // As if exported before the child started: the replay stops there.
    history.entries.pop();
    history.output = None;
    let adds = count(&key, "add");
    let replayed = replay(&history, r_parent).await.unwrap();
    assert_eq!(replayed.stop, ReplayStop::HistoryEnd);
    assert_eq!(count(&key, "add"), adds, "the replay ran the child's step");
}

/// A replay without side effects stops at a transactional step the history
/// has not recorded, as at a plain step: its body never runs (not even in
/// the replay's private database).
async fn a_transactional_step_beyond_the_history_does_not_run(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = key();
    assert_eq!(r_pay(key.clone()).id(&key).on(&keiro).await.unwrap(), Ok(2));
    let mut history = keiro.export(&key).await.unwrap();
    let names: Vec<&str> = history.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["r_add", "r_write"]);
    assert_eq!(count(&key, "write"), 1);
    // The whole history: the journaled result comes back, the body stays put.
    assert!(replay(&history, r_pay).await.unwrap().output_matches());
    assert_eq!(count(&key, "write"), 1, "a replay ran a journaled body");
    // As if exported before the transactional step ran: the replay stops there.
    history.entries.pop();
    history.output = None;
    let replayed = replay(&history, r_pay).await.unwrap();
    assert_eq!(replayed.stop, ReplayStop::HistoryEnd);
    assert_eq!((replayed.matched, replayed.entries), (1, 1));
    assert_eq!(count(&key, "write"), 1, "a replay ran a transactional body");
}

/// The pre-deploy check of an instance not run yet whose first step is
/// transactional replays it to its (empty) history's end: it finds nothing
/// wrong and runs no body.
async fn check_does_not_run_a_transactional_step(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let pending = key();
    let input = serde_json::json!([pending]).to_string();
    create_pending(&keiro, &pending, "r_pay_first", &input).await;
    let report = keiro.check().await.unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.checked, 1, "{report}");
    assert_eq!(
        count(&pending, "write"),
        0,
        "the check ran a transactional body"
    );
    assert_eq!(
        keiro.summary(&pending).await.unwrap().status,
        WorkflowStatus::Pending
    );
}
