//! Two functions registering one workflow name in one binary are refused when
//! the runtime starts, with an error naming both functions.

use keiro::workflow;

mod billing {
    #[keiro::workflow(name = "pay")]
    pub async fn charge_card(cents: u64) -> u64 {
        cents
    }
}

#[workflow(name = "pay")]
async fn pay(cents: u64) -> u64 {
    cents
}

#[tokio::test]
async fn a_name_registered_twice_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("keiro.db").display());
    let err = keiro::Keiro::connect(&url).await.unwrap_err();
    assert!(
        matches!(err, keiro::Error::DuplicateWorkflow { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("`pay`"), "{text}");
    assert!(
        text.contains("duplicate_names::billing::charge_card"),
        "{text}"
    );
    assert!(text.contains("duplicate_names::pay"), "{text}");
    // Both are still callable as plain functions' calls; only the runtime refuses.
    let _ = (pay(1), billing::charge_card(1));
}
