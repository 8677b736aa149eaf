//! Application versions, on both backends: every instance records the
//! version of the process that created it; a resume worker claims only its
//! own version, declared compatible ones and unversioned instances, counts
//! and logs (once per version) the due work of other versions; `retarget`
//! moves unfinished instances, and only those, to another version.

use std::sync::{Arc, Mutex};

use keiro::{step, workflow, Error, ListFilter, ResumeEvent, ResumeOptions, WorkflowStatus};
use keiro_store::NewInstance;
use keiro_tests::{on_both_backends, ran, runs, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

#[step]
async fn note(key: String) -> String {
    ran(&key, "note");
    key
}

#[workflow]
async fn versioned(key: String) -> String {
    note(key).await
}

#[workflow]
async fn versioned_parent(key: String) -> Result<String, String> {
    versioned(format!("{key}-child"))
        .await
        .map_err(|e| e.to_string())
}

/// The version recorded with instance `id`.
async fn version_of(keiro: &keiro::Keiro, id: &str) -> Option<String> {
    keiro.summary(id).await.unwrap().version
}

async fn instances_record_the_version_of_the_process_that_created_them(backend: Backend) {
    let db = TestDb::new(backend).await;
    let v1 = db.builder().app_version("v1").connect().await.unwrap();
    assert_eq!(v1.app_version(), "v1");
    let key = uuid::Uuid::new_v4().to_string();
    // Run here: the instance and its child record v1.
    let out = versioned_parent(key.clone())
        .id(&key)
        .on(&v1)
        .await
        .unwrap();
    assert_eq!(out, Ok(format!("{key}-child")));
    assert_eq!(version_of(&v1, &key).await.as_deref(), Some("v1"));
    let child = v1
        .list(&ListFilter::default().parent_id(&key))
        .await
        .unwrap();
    assert_eq!(child.items.len(), 1);
    assert_eq!(child.items[0].version.as_deref(), Some("v1"));
    // Enqueued by another process: that process's version.
    let v2 = db.builder().app_version("v2").connect().await.unwrap();
    let queued = format!("{key}-queued");
    versioned(queued.clone())
        .id(&queued)
        .on(&v2)
        .enqueue()
        .await
        .unwrap();
    assert_eq!(version_of(&v1, &queued).await.as_deref(), Some("v2"));
    // The version filter lists one version's instances.
    let listed = v1.list(&ListFilter::default().version("v2")).await.unwrap();
    let ids: Vec<_> = listed.items.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [queued.as_str()]);
    // A fork copies its source's version (a retry keeps the row's).
    let fork = format!("{key}-fork");
    v2.fork_as(&key, keiro::ForkFrom::Step(0), &fork)
        .await
        .unwrap();
    assert_eq!(version_of(&v1, &fork).await.as_deref(), Some("v1"));
    // The default version is a hash of the linked workflows' bodies: stable.
    let default_a = db.keiro().await;
    let default_b = db.keiro().await;
    assert_eq!(default_a.app_version(), default_b.app_version());
    assert_eq!(
        default_a.app_version().len(),
        16,
        "{}",
        default_a.app_version()
    );
}

async fn a_worker_skips_other_versions_counts_them_and_logs_each_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let v1 = db.builder().app_version("v1").connect().await.unwrap();
    let v2 = db.builder().app_version("v2").connect().await.unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let ids: Vec<String> = (0..3).map(|n| format!("{key}-{n}")).collect();
    for id in &ids {
        versioned(id.clone())
            .id(id)
            .on(&v1)
            .enqueue()
            .await
            .unwrap();
    }
    // An unversioned instance (created before versions were recorded).
    let old = format!("{key}-old");
    keiro::unstable::raw_store(&v1)
        .create_instance(&NewInstance::new(
            &old,
            "versioned",
            &serde_json::to_string(&(old.clone(),)).unwrap(),
        ))
        .await
        .unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let options = ResumeOptions::default().log(move |event| {
        if let ResumeEvent::OtherVersion { version, due, own } = event {
            seen.lock()
                .unwrap()
                .push((version.clone(), *due, own.clone()));
        }
    });
    let summary = v2.resume_once(&options).await.unwrap();
    assert_eq!(summary.resumed, 1, "only the unversioned one: {summary:?}");
    assert_eq!(summary.other_version, 3, "{summary:?}");
    assert_eq!(
        *events.lock().unwrap(),
        [("v1".to_owned(), 3, "v2".to_owned())],
        "one event for the version, not one per instance"
    );
    assert_eq!(runs(&old), ["note"]);
    for id in &ids {
        assert!(runs(id).is_empty(), "{id} ran on a v2 worker");
        let status = v2
            .handle::<String>(id)
            .await
            .unwrap()
            .status()
            .await
            .unwrap();
        assert_eq!(status, WorkflowStatus::Pending, "{id}");
    }
    // The versions holding due work are visible.
    let counts = v2.version_counts().await.unwrap();
    let v1_count = counts
        .iter()
        .find(|c| c.version.as_deref() == Some("v1"))
        .expect("v1 holds work");
    assert_eq!((v1_count.unfinished, v1_count.due), (3, 3));
    // A worker declaring v1 compatible takes them.
    let v3 = db
        .builder()
        .app_version("v3")
        .compatible_versions(["v1"])
        .connect()
        .await
        .unwrap();
    assert_eq!(v3.compatible_versions(), ["v1".to_owned()]);
    let summary = v3.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.resumed, summary.other_version),
        (3, 0),
        "{summary:?}"
    );
    for id in &ids {
        assert_eq!(runs(id), ["note"], "{id}");
    }
}

async fn retarget_moves_only_unfinished_instances(backend: Backend) {
    let db = TestDb::new(backend).await;
    let v1 = db.builder().app_version("v1").connect().await.unwrap();
    let v2 = db.builder().app_version("v2").connect().await.unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let done = format!("{key}-done");
    versioned(done.clone()).id(&done).on(&v1).await.unwrap();
    let waiting = format!("{key}-waiting");
    versioned(waiting.clone())
        .id(&waiting)
        .on(&v1)
        .enqueue()
        .await
        .unwrap();
    assert_eq!(v2.resume_once(&quiet()).await.unwrap().other_version, 1);
    assert_eq!(v2.retarget("v1", "v2").await.unwrap(), 1);
    assert_eq!(version_of(&v2, &waiting).await.as_deref(), Some("v2"));
    assert_eq!(version_of(&v2, &done).await.as_deref(), Some("v1"));
    let summary = v2.resume_once(&quiet()).await.unwrap();
    assert_eq!(
        (summary.resumed, summary.other_version),
        (1, 0),
        "{summary:?}"
    );
    assert_eq!(runs(&waiting), ["note"]);
    // Nothing unfinished is left under v1.
    assert_eq!(v2.retarget("v1", "v2").await.unwrap(), 0);
}

async fn a_bad_version_is_refused_naming_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    for bad in ["", "two words", "tab\there"] {
        let err = db.builder().app_version(bad).connect().await.unwrap_err();
        assert!(matches!(err, Error::InvalidAppVersion { .. }), "{err:?}");
        assert!(
            err.to_string().contains("KeiroBuilder::app_version"),
            "{err}"
        );
    }
    let err = db
        .builder()
        .compatible_versions(["ok", ""])
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("compatible_versions"), "{err}");
    let keiro = db.keiro().await;
    let err = keiro.retarget("v1", "no good").await.unwrap_err();
    assert!(err.to_string().contains("`no good`"), "{err}");
}

on_both_backends!(
    instances_record_the_version_of_the_process_that_created_them,
    a_worker_skips_other_versions_counts_them_and_logs_each_once,
    retarget_moves_only_unfinished_instances,
    a_bad_version_is_refused_naming_it,
);
