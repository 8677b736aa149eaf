//! The outbox on both backends: `send_tx`, `enqueue_tx` and
//! `resolve_awakeable_tx` write in the caller's own transaction, next to the
//! application's state change: rolled back, nothing happened; committed, the
//! workflow receives, starts or resumes.

use std::time::Duration;

use keiro::{workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_tests::in_tx;
use keiro_tests::{on_both_backends, Backend, TestDb};

async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .suspend_after(Duration::from_millis(100))
        .connect()
        .await
        .unwrap()
}

/// The application's own state change, made in the same transaction.
macro_rules! record_order {
    ($tx:ident, $id:expr) => {
        assert_eq!(
            sqlx::query("INSERT INTO app_orders (id) VALUES ($1)")
                .bind($id)
                .execute(&mut *$tx)
                .await
                .unwrap()
                .rows_affected(),
            1
        )
    };
}

async fn app_table(keiro: &Keiro) {
    in_tx!(keiro, true, |tx| {
        sqlx::query("CREATE TABLE IF NOT EXISTS app_orders (id TEXT PRIMARY KEY)")
            .execute(&mut *tx)
            .await
            .unwrap();
    });
}

async fn has_order(keiro: &Keiro, id: &str) -> bool {
    let count: i64 = in_tx!(keiro, false, |tx| sqlx::query_scalar(
        "SELECT COUNT(*) FROM app_orders WHERE id = $1"
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await
    .unwrap());
    count == 1
}

#[workflow]
async fn inbox(key: String) -> Result<u32, String> {
    let _ = key;
    keiro::recv::<u32>("payment")
        .await
        .map_err(|e| e.to_string())
}

async fn wait_suspended(keiro: &Keiro, id: &str) {
    for _ in 0..300 {
        let row = keiro.store().get_instance(id).await.unwrap().unwrap();
        if row.status.as_str() == "suspended" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never suspended");
}

async fn send_tx_commits_with_the_callers_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    app_table(&keiro).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = inbox(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    wait_suspended(&keiro, &key).await;

    in_tx!(keiro, false, |tx| {
        record_order!(tx, "paid-rolled-back");
        keiro::send_tx(&mut tx, &key, "payment", &1_u32)
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);
    assert!(!has_order(&keiro, "paid-rolled-back").await);

    // Refused sends write nothing and leave the caller's transaction usable.
    in_tx!(keiro, true, |tx| {
        let err = keiro::send_tx(&mut tx, "no-such-workflow", "payment", &3_u32)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
        record_order!(tx, "paid");
        keiro::send_tx(&mut tx, &key, "payment", &2_u32)
            .await
            .unwrap()
    });
    assert!(has_order(&keiro, "paid").await);
    let got = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("the committed message wakes the receiver")
        .unwrap();
    assert_eq!(got, Ok(2), "the rolled-back message was never sent");
    in_tx!(keiro, true, |tx| {
        let err = keiro::send_tx(&mut tx, &key, "payment", &4_u32)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotReceiving { .. }), "{err}");
    });
}

#[workflow]
async fn shipment(order: String) -> String {
    format!("shipped {order}")
}

async fn enqueue_tx_commits_with_the_callers_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    app_table(&keiro).await;
    let worker = keiro
        .resume_worker(
            ResumeOptions::default()
                .poll_interval(Duration::from_millis(50))
                .log(|_| {}),
        )
        .await
        .unwrap();
    let id = format!("ship-{}", uuid::Uuid::new_v4().simple());

    in_tx!(keiro, false, |tx| {
        record_order!(tx, "order-1");
        shipment("order-1".into())
            .id(&id)
            .on(&keiro)
            .enqueue_tx(&mut tx)
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = keiro.handle::<String>(&id).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(!has_order(&keiro, "order-1").await);

    let handle = in_tx!(keiro, true, |tx| {
        record_order!(tx, "order-1");
        shipment("order-1".into())
            .id(&id)
            .on(&keiro)
            .enqueue_tx(&mut tx)
            .await
            .unwrap()
    });
    assert!(has_order(&keiro, "order-1").await);
    let out = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("a worker runs the committed instance")
        .unwrap();
    assert_eq!(out, "shipped order-1");
    // The same id with other arguments is refused, in a transaction too.
    in_tx!(keiro, false, |tx| {
        let err = shipment("order-2".into())
            .id(&id)
            .on(&keiro)
            .enqueue_tx(&mut tx)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InputMismatch { .. }), "{err}");
    });
    worker.shutdown().await;
}

#[workflow]
async fn approval(key: String) -> Result<bool, String> {
    let _ = key;
    let answer = keiro::awakeable::<bool>().await;
    keiro::set_event("awakeable", &answer.id().to_string())
        .await
        .map_err(|e| e.to_string())?;
    answer.await.map_err(|e| e.to_string())
}

async fn resolve_awakeable_tx_commits_with_the_callers_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    app_table(&keiro).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = approval(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let awakeable: String = keiro
        .get_event(&key, "awakeable")
        .wait(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the workflow publishes its awakeable id");
    wait_suspended(&keiro, &key).await;

    in_tx!(keiro, false, |tx| {
        record_order!(tx, "approved-rolled-back");
        keiro::resolve_awakeable_tx(&mut tx, &awakeable, &false)
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Suspended);

    in_tx!(keiro, true, |tx| {
        let err = keiro::resolve_awakeable_tx(&mut tx, &awakeable, "yes")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::AwakeableTypeMismatch { .. }), "{err}");
        record_order!(tx, "approved");
        keiro::resolve_awakeable_tx(&mut tx, &awakeable, &true)
            .await
            .unwrap()
    });
    let got = tokio::time::timeout(Duration::from_secs(10), handle.result())
        .await
        .expect("the committed answer resumes the workflow")
        .unwrap();
    assert_eq!(got, Ok(true), "the rolled-back answer was never recorded");
    assert!(has_order(&keiro, "approved").await);
    in_tx!(keiro, false, |tx| {
        let err = keiro::resolve_awakeable_tx(&mut tx, &awakeable, &false)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::AlreadyResolved { .. } | Error::AwakeableWorkflowFinished { .. }
            ),
            "{err}"
        );
    });
}

on_both_backends!(
    send_tx_commits_with_the_callers_transaction,
    enqueue_tx_commits_with_the_callers_transaction,
    resolve_awakeable_tx_commits_with_the_callers_transaction,
);
