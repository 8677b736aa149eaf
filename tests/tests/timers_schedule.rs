//! Scheduling durable timers through `keiro::timers`, on both backends: the
//! runtime and a bare store share one timer table, `schedule` is idempotent on
//! the id (`schedule_once` keeps the first), bad requests are refused, and the
//! `*_tx` variants follow the caller's transaction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use keiro::timers::{
    schedule_tx, ScheduleOutcome, TimerError, TimerId, TimerRequest, TimerStatus,
    TimerWorkerOptions,
};

use keiro_tests::timers::{counting, past, pool, row, schedule, timers, Pool, PM};
use keiro_tests::{on_both_backends, Backend, TestDb};

on_both_backends!(
    runtime_and_bare_store_share_the_timers,
    schedule_is_idempotent_on_the_id,
    schedule_refuses_a_bad_request,
    schedule_tx_follows_the_callers_transaction,
);

async fn runtime_and_bare_store_share_the_timers(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    schedule(&keiro.timers(), past("from-runtime")).await;
    let bare = timers(&db).await;
    let timer = row(&bare, "from-runtime").await;
    assert_eq!(timer.status, TimerStatus::Scheduled);
    assert_eq!(timer.process_manager, PM);
    assert_eq!(timer.correlation_id, "order-from-runtime");
    assert_eq!(bare.count_due().await.unwrap(), 1);
}

async fn schedule_is_idempotent_on_the_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let later = SystemTime::now() + Duration::from_secs(3600);
    let first = TimerRequest::new("t-1", PM, "order-1", later)
        .payload(serde_json::json!({ "n": 1, "tags": ["a", "b"] }));
    schedule(&timers, first.clone()).await;
    let moved = TimerRequest {
        fire_at: later + Duration::from_secs(60),
        ..first.clone().payload(serde_json::json!({ "n": 2 }))
    };
    assert_eq!(
        timers.schedule(&moved).await.unwrap(),
        ScheduleOutcome::Updated
    );
    let stored = row(&timers, "t-1").await;
    assert_eq!(stored.payload, serde_json::json!({ "n": 2 }));
    assert_eq!(
        stored
            .fire_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
        (later + Duration::from_secs(60))
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros(),
        "stored with microsecond precision"
    );

    assert!(!timers.schedule_once(&first).await.unwrap());
    assert_eq!(row(&timers, "t-1").await.payload["n"], 2);
    assert!(timers.schedule_once(&past("t-2")).await.unwrap());

    #[derive(serde::Deserialize, PartialEq, Debug)]
    struct Payload {
        n: u32,
    }
    assert_eq!(
        row(&timers, "t-1").await.payload_as::<Payload>().unwrap(),
        Payload { n: 2 }
    );
    assert!(matches!(
        row(&timers, "t-2").await.payload_as::<Payload>(),
        Err(TimerError::Payload { .. })
    ));
}

async fn schedule_refuses_a_bad_request(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    for bad in [
        past(""),
        TimerRequest {
            process_manager: String::new(),
            ..past("t-1")
        },
        TimerRequest {
            fire_at: SystemTime::UNIX_EPOCH - Duration::from_secs(1),
            ..past("t-1")
        },
    ] {
        let error = timers.schedule(&bad).await.unwrap_err();
        assert!(
            matches!(error, TimerError::InvalidRequest { .. }),
            "{error}"
        );
    }
    assert_eq!(timers.count_due().await.unwrap(), 0);
}

async fn schedule_tx_follows_the_callers_transaction(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    // Rolled back: no timer. Committed: the timer exists and fires.
    match pool(&timers) {
        Pool::Sqlite(s) => {
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            schedule_tx(&mut tx, &past("rolled-back")).await.unwrap();
            tx.rollback().await.unwrap();
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            schedule_tx(&mut tx, &past("committed")).await.unwrap();
            assert!(
                !keiro::timers::schedule_once_tx(&mut tx, &past("committed"))
                    .await
                    .unwrap()
            );
            tx.commit().await.unwrap();
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.unwrap();
            schedule_tx(&mut tx, &past("rolled-back")).await.unwrap();
            tx.rollback().await.unwrap();
            let mut tx = p.begin().await.unwrap();
            schedule_tx(&mut tx, &past("committed")).await.unwrap();
            assert!(
                !keiro::timers::schedule_once_tx(&mut tx, &past("committed"))
                    .await
                    .unwrap()
            );
            tx.commit().await.unwrap();
        }
    }
    assert_eq!(
        timers.get(&TimerId::new("rolled-back")).await.unwrap(),
        None
    );
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let summary = timers
        .drain(&TimerWorkerOptions::default(), 10, counting(&counts))
        .await
        .unwrap();
    assert_eq!(summary.fired, 1);
    assert_eq!(counts.lock().unwrap().get("committed"), Some(&1));

    // Cancel in a transaction too.
    schedule(&timers, past("to-cancel")).await;
    let change = match pool(&timers) {
        Pool::Sqlite(s) => {
            let mut tx = s.begin_with("BEGIN IMMEDIATE").await.unwrap();
            let change = keiro::timers::cancel_tx(&mut tx, &TimerId::new("to-cancel"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            change
        }
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.unwrap();
            let change = keiro::timers::cancel_tx(&mut tx, &TimerId::new("to-cancel"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            change
        }
    };
    assert!(change.is_applied());
    assert_eq!(
        row(&timers, "to-cancel").await.status,
        TimerStatus::Cancelled
    );
}
