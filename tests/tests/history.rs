//! Histories on both backends: `keiro.export(id)` writes an instance's
//! input, every journal entry and its outcome as a JSON document that reads
//! back, and refuses what it cannot be.

use std::time::Duration;

use keiro::{step, workflow, Error, History, HistoryError, HISTORY_FORMAT};
use keiro_tests::{on_both_backends, ran, Backend, TestDb};

on_both_backends!(
    export_holds_input_every_entry_and_the_outcome,
    export_of_an_unknown_id_is_not_found,
    export_of_an_unfinished_instance_has_no_output,
);

#[step]
async fn h_add(key: String, n: u32) -> u32 {
    ran(&key, "add");
    n + 1
}

#[step]
async fn h_refuse(key: String) -> Result<u32, String> {
    ran(&key, "refuse");
    Err(format!("no stock for {key}"))
}

/// A step, a journaled clock, a step's `Err`, a step: four entries.
#[workflow]
async fn h_order(key: String, qty: u32) -> Result<u32, String> {
    let a = h_add(key.clone(), qty).await;
    keiro::now().await;
    let refused = h_refuse(key.clone()).await.is_err();
    let b = h_add(key, a).await;
    Ok(b + u32::from(refused))
}

/// A step, then a wait on an awakeable nobody answers.
#[workflow]
async fn h_waits(key: String) -> bool {
    h_add(key.clone(), 0).await;
    keiro::awakeable::<bool>().await.await.unwrap_or(false)
}

async fn export_holds_input_every_entry_and_the_outcome(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let out = h_order(key.clone(), 7).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(10));

    let history = keiro.export(&key).await.unwrap();
    assert_eq!(history.format, HISTORY_FORMAT);
    assert_eq!(history.workflow, "h_order");
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
            (0, "step", "h_add"),
            (1, "now", "now"),
            (2, "step", "h_refuse"),
            (3, "step", "h_add"),
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
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let handle = h_waits(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_suspended(&handle).await;
    let history = keiro.export(&key).await.unwrap();
    assert_eq!(history.status, "suspended");
    assert!(history.output.is_none());
    let kinds: Vec<&str> = history.entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["step", "awakeable"]);
}

async fn wait_suspended<R: serde::de::DeserializeOwned>(handle: &keiro::WorkflowHandle<R>) {
    for _ in 0..500 {
        if handle.status().await.unwrap() == keiro::WorkflowStatus::Suspended {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} did not suspend", handle.id());
}
