//! What the `keiro` command builds on, tested as library calls on both
//! backends: a runtime that does not migrate (`KeiroBuilder::migrate(false)`)
//! refuses a schema behind this build's and creates nothing; the schema
//! version is readable; an untyped awakeable answer
//! (`Keiro::resolve_awakeable_json`) reaches the workflow, and one of the
//! wrong type fails only the workflow's read of it.

use std::time::Duration;

use keiro::{workflow, Error, Keiro, ResumeOptions, StoreError};
use keiro_store::{Store, StoreOptions};
use keiro_tests::{on_both_backends, ran, runs, Backend, TestDb};
use serde_json::json;

on_both_backends!(
    without_migrating_an_older_schema_is_refused,
    untyped_answers_reach_the_workflow,
);

async fn without_migrating_an_older_schema_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let operator = || Keiro::builder(&db.url).migrate(false).connect();

    // A fresh database: refused, and (SQLite) no file created.
    let error = operator().await.unwrap_err();
    match (&error, backend) {
        (
            Error::Store(StoreError::NotMigrated {
                version: None,
                expected,
                ..
            }),
            Backend::Postgres,
        ) => assert!(*expected >= 10),
        (Error::Store(StoreError::Connect { .. }), Backend::Sqlite) => {
            let path = db.url.strip_prefix("sqlite:").unwrap();
            assert!(!std::path::Path::new(path).exists(), "created {path}");
        }
        _ => panic!("{error:?}"),
    }
    assert!(
        error
            .to_string()
            .contains(&keiro_store::redact_url(&db.url)),
        "{error}"
    );

    // Migrated by an ordinary connect: the version is this build's, and an
    // operator connection opens it.
    let store = Store::connect(&db.url, &StoreOptions::default())
        .await
        .unwrap();
    let expected = store.expected_schema_version();
    assert_eq!(store.schema_version().await.unwrap(), Some(expected));
    let keiro = operator().await.unwrap();
    assert!(keiro
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());

    // One migration forgotten: refused naming both versions and the fix. The
    // version left is the highest migration below the latest (numbers may
    // have gaps while parts of a batch land).
    let migrator = match store.backend() {
        "sqlite" => &keiro_store::SQLITE_MIGRATOR,
        _ => &keiro_store::POSTGRES_MIGRATOR,
    };
    let previous = migrator
        .iter()
        .map(|m| m.version)
        .filter(|&v| v < expected)
        .max()
        .unwrap();
    let forget = "DELETE FROM {t} WHERE version = (SELECT MAX(version) FROM {t})";
    match store.backend() {
        "sqlite" => {
            let sql = forget.replace("{t}", "_sqlx_migrations");
            sqlx::query(&sql)
                .execute(keiro.store().sqlite_pool().unwrap())
                .await
                .unwrap();
        }
        _ => {
            let sql = forget.replace("{t}", "keiro._sqlx_migrations");
            sqlx::query(&sql)
                .execute(keiro.store().postgres_pool().unwrap())
                .await
                .unwrap();
        }
    }
    assert_eq!(store.schema_version().await.unwrap(), Some(previous));
    let error = operator().await.unwrap_err();
    assert!(
        matches!(&error, Error::Store(StoreError::NotMigrated { version: Some(v), expected: e, .. })
            if *v == previous && *e == expected),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains(&format!("at schema version {previous}")),
        "{text}"
    );
    assert!(text.contains("run `keiro migrate`"), "{text}");
    store.close().await;
}

/// Awaits a `u32` through an awakeable whose id it hands out.
#[workflow]
async fn json_answered(key: String) -> Result<u32, String> {
    let answer = keiro::awakeable::<u32>().await;
    ran(&key, answer.id());
    answer.await.map_err(|e| e.to_string())
}

async fn untyped_answers_reach_the_workflow(backend: Backend) {
    let db = TestDb::new(backend).await;
    let worker = db
        .builder()
        .suspend_after(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let operator = Keiro::builder(&db.url)
        .migrate(false)
        .connect()
        .await
        .unwrap();
    let quiet = ResumeOptions::default().log(|_| {});
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let [good, bad] = [format!("good-{tag}"), format!("bad-{tag}")];
    for key in [&good, &bad] {
        json_answered(key.clone())
            .id(key)
            .on(&worker)
            .enqueue()
            .await
            .unwrap();
    }
    let summary = worker.resume_once(&quiet).await.unwrap();
    assert_eq!(summary.still_suspended, 2, "{summary:?}");
    let id_of = |key: &str| runs(key).first().cloned().expect("an awakeable id");

    operator
        .resolve_awakeable_json(&id_of(&good), json!(42))
        .await
        .unwrap();
    // Not a u32: accepted here (the type is unknown to the operator), and
    // the workflow's read of it fails with the decode error.
    operator
        .resolve_awakeable_json(&id_of(&bad), json!("forty-two"))
        .await
        .unwrap();
    let error = operator
        .resolve_awakeable_json(&id_of(&good), json!(7))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::AlreadyResolved { .. }), "{error:?}");
    let error = operator
        .resolve_awakeable_json("no/such/awakeable", json!(1))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::UnknownAwakeable { .. }), "{error:?}");

    let summary = worker.resume_once(&quiet).await.unwrap();
    if summary.completed != 2 {
        let mut rows = Vec::new();
        for key in [&good, &bad] {
            rows.push(format!(
                "{:?}",
                keiro::unstable::raw_store(&worker).get_instance(key).await
            ));
        }
        panic!("{summary:?}\n{}", rows.join("\n"));
    }
    let result = |key: String| {
        let worker = worker.clone();
        async move {
            worker
                .handle::<Result<u32, String>>(&key)
                .await
                .unwrap()
                .result()
                .await
                .unwrap()
        }
    };
    assert_eq!(result(good).await, Ok(42));
    let failed = result(bad).await.unwrap_err();
    assert!(failed.contains("decode"), "{failed}");
}
