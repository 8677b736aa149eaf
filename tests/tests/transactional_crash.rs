//! A `#[step(transaction)]` killed with SIGKILL between the application's
//! writes and its commit, in a real child process: neither the writes nor
//! the step's journal row remain; a fresh process under the same executor
//! identity resumes the instance and the step takes effect once.

use keiro::StepOutcome;
use keiro_tests::process::CrashChild;
use keiro_tests::transactional::{bank, open_bank, BankError};
use keiro_tests::{on_every_backend, Backend, TestDb};

const CHILD: &str = env!("CARGO_BIN_EXE_tx_step");

async fn killed_before_commit_leaves_nothing_and_resumes_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    open_bank(store, 100).await;
    let id = format!("tx-crash-{}", uuid::Uuid::new_v4().simple());
    let executor = format!("tx-crash-test-{}", uuid::Uuid::new_v4().simple());

    let args = ["pay", &id, "e1", "pause"];
    let mut child = CrashChild::start(CHILD, &db, &executor, &args, None);
    child.line_starting("INSERTED e1").await;
    child.kill().await; // SIGKILL, the transaction open with its writes

    assert_eq!(
        bank(store).await,
        (100, 0),
        "writes of the killed step remain"
    );
    let steps = keiro.steps(&id).await.unwrap();
    let names: Vec<_> = steps.iter().map(|s| (s.seq, s.name.as_str())).collect();
    assert_eq!(names, [(0, "note")], "the killed step was journaled");

    let (out, _) = CrashChild::start(CHILD, &db, &executor, &["resume", &id], None)
        .done()
        .await;
    let out: Result<i64, BankError> = serde_json::from_value(out).unwrap();
    assert_eq!(out, Ok(90));
    assert_eq!(bank(store).await, (90, 1), "the step took effect once");
    let steps = keiro.steps(&id).await.unwrap();
    let debit = steps.iter().find(|s| s.seq == 1).expect("the debit's row");
    assert_eq!(debit.name, "debit");
    assert_eq!(debit.outcome, StepOutcome::Ok);
    assert_eq!(debit.value, serde_json::json!(90));
    assert_eq!(debit.attempts, Some(1), "the resumed run ran the body once");
}

on_every_backend!(killed_before_commit_leaves_nothing_and_resumes_once);
