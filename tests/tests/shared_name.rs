//! Two binaries sharing one database each register a workflow named
//! `shared_greeting`, with different argument types. An instance the first
//! enqueues is left alone by the second's resume worker, which reports it on
//! every pass without counting a crash, and the first's worker completes it.

use keiro_tests::process::CrashChild;
use keiro_tests::{on_both_backends, Backend, TestDb};

const A: &str = env!("CARGO_BIN_EXE_shared_name_a");
const B: &str = env!("CARGO_BIN_EXE_shared_name_b");

async fn another_binarys_same_named_workflow_is_left_alone(backend: Backend) {
    let db = TestDb::new(backend).await;
    let id = format!("shared-{}", uuid::Uuid::new_v4().simple());
    CrashChild::start(A, &db, "shared-a", &["enqueue", &id], None)
        .done()
        .await;

    for pass in 0..2 {
        let mut b = CrashChild::start(B, &db, "shared-b", &["pass"], None);
        let event = b.line_starting("EVENT").await;
        assert_eq!(
            event,
            format!(
                "EVENT SignatureMismatch shared_greeting {id} (u32,)->String (String,)->String"
            ),
            "pass {pass}"
        );
        let (summary, _) = b.done().await;
        assert_eq!(
            summary,
            serde_json::json!({"discovered": 1, "resumed": 0, "unknown_name": 1, "failed": 0}),
            "pass {pass}"
        );
    }
    let keiro = db.keiro().await;
    let row = keiro.store().get_instance(&id).await.unwrap().unwrap();
    assert_eq!(
        (row.status.as_str(), row.attempts, row.lease_owner),
        ("pending", 0, None)
    );
    assert_eq!(row.signature.as_deref(), Some("(u32,)->String"));

    let (out, _) = CrashChild::start(A, &db, "shared-a", &["resume", &id], None)
        .done()
        .await;
    assert_eq!(out, "A:7");
}

on_both_backends!(another_binarys_same_named_workflow_is_left_alone);
