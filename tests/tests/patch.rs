//! Patches, on both backends: `keiro::patched` sends instances recorded
//! before a patch down the old branch (claiming no step id, re-running no
//! step) and new ones down the new branch (a `patch` marker in the journal,
//! answered the same by every replay), across a real process restart between
//! the two deployments; `keiro::deprecate_patch` still replays marker
//! journals and records nothing in new runs; a marker of another patch is
//! non-determinism naming both.

use std::time::{Duration, Instant};

use keiro::{step, workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_store::{NewInstance, StepRow};
use keiro_tests::deployments::{deploy, version};
use keiro_tests::process::{lines_of, CrashChild};
use keiro_tests::{on_both_backends, ran, runs, Backend, TestDb};

#[step]
async fn prepare(key: String) -> u32 {
    ran(&key, "prepare");
    1
}

#[step]
async fn reserve_courier(key: String) -> u32 {
    ran(&key, "reserve_courier");
    2
}

#[step]
async fn finish(key: String, express: bool) -> String {
    ran(&key, "finish");
    if express { "express" } else { "standard" }.to_owned()
}

/// `prepare`, then the courier patch as the code deployed for `key` has it
/// (v1 knows no patch, v2 calls `patched("courier")`, v3 deprecates it, v4
/// calls `patched("courier-v2")` instead, v5 drops the call), a durable
/// sleep of `nap_ms`,
/// `finish`.
#[workflow]
async fn parcel(key: String, nap_ms: u64) -> Result<String, String> {
    prepare(key.clone()).await;
    let express = match version(&key) {
        1 => false,
        2 => keiro::patched("courier").await,
        3 => {
            keiro::deprecate_patch("courier").await;
            true
        }
        4 => keiro::patched("courier-v2").await,
        // The patch call removed outright, without deprecating it first.
        _ => true,
    };
    if express {
        reserve_courier(key.clone()).await;
    }
    keiro::sleep(Duration::from_millis(nap_ms)).await;
    Ok(finish(key, express).await)
}

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

/// A runtime that suspends waits longer than 50 ms.
async fn runtime(db: &TestDb) -> Keiro {
    db.builder()
        .suspend_after(Duration::from_millis(50))
        .connect()
        .await
        .unwrap()
}

/// Enqueues `parcel(key, nap_ms)` under id `key` and runs it until it
/// suspends in its sleep.
async fn suspend_in_sleep(keiro: &Keiro, key: &str, nap_ms: u64) {
    parcel(key.to_owned(), nap_ms)
        .id(key)
        .on(keiro)
        .enqueue()
        .await
        .unwrap();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!((summary.resumed, summary.still_suspended), (1, 1));
}

/// Resumes `key` once its sleep is due, until it ends; its result.
async fn resume_to_end(keiro: &Keiro, key: &str) -> Result<String, String> {
    let handle = keiro.handle::<Result<String, String>>(key).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        keiro.resume_once(&quiet()).await.unwrap();
        let status = handle.status().await.unwrap();
        if !matches!(
            status,
            WorkflowStatus::Suspended | WorkflowStatus::Pending | WorkflowStatus::Running
        ) {
            return handle.result().await.unwrap();
        }
        assert!(Instant::now() < deadline, "{key} never ended: {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The journal of `key` as `kind name` strings.
async fn journal(keiro: &Keiro, key: &str) -> Vec<String> {
    keiro
        .store()
        .load_journal(key, 0)
        .await
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.kind, r.name))
        .collect()
}

async fn old_instances_take_the_old_branch_new_ones_the_new(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let old = uuid::Uuid::new_v4().to_string();
    // Recorded by v1: `prepare`, then suspended in its sleep.
    suspend_in_sleep(&keiro, &old, 300).await;
    assert_eq!(journal(&keiro, &old).await, ["step prepare", "sleep sleep"]);

    // v2 is deployed: the old instance answers `false` (the sleep stands
    // where the marker would go) and its entries line up.
    deploy(&old, 2);
    assert_eq!(resume_to_end(&keiro, &old).await, Ok("standard".into()));
    assert_eq!(runs(&old), ["prepare", "finish"], "no step re-ran");
    assert_eq!(
        journal(&keiro, &old).await,
        ["step prepare", "sleep sleep", "step finish"],
        "no marker in an old journal"
    );

    // A new instance under v2 takes the new branch and records the marker.
    let new = uuid::Uuid::new_v4().to_string();
    deploy(&new, 2);
    suspend_in_sleep(&keiro, &new, 300).await;
    assert_eq!(
        journal(&keiro, &new).await,
        [
            "step prepare",
            "patch courier",
            "step reserve_courier",
            "sleep sleep"
        ]
    );
    // Its replay after the suspension meets the marker: `true` again, and
    // no step before it re-runs.
    assert_eq!(resume_to_end(&keiro, &new).await, Ok("express".into()));
    assert_eq!(runs(&new), ["prepare", "reserve_courier", "finish"]);
    let steps = keiro.steps(&new).await.unwrap();
    let marker = steps.iter().find(|s| s.kind == "patch").unwrap();
    assert_eq!((marker.seq, marker.name.as_str()), (1, "courier"));
}

#[step]
async fn crash_once(key: String) -> u32 {
    if runs(&key).iter().filter(|r| *r == "crash_once").count() == 0 {
        ran(&key, "crash_once");
        panic!("crash after the marker of {key}");
    }
    3
}

/// Patched, then a step that crashes the first run.
#[workflow]
async fn crashy(key: String) -> Result<bool, String> {
    let patched = keiro::patched("crash-fix").await;
    prepare(key.clone()).await;
    crash_once(key).await;
    Ok(patched)
}

async fn a_replay_after_a_crash_answers_true_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let err = crashy(key.clone()).id(&key).on(&keiro).await.unwrap_err();
    assert!(matches!(err, Error::Panicked { .. }), "{err}");
    assert_eq!(
        journal(&keiro, &key).await,
        ["patch crash-fix", "step prepare"]
    );
    let out = crashy(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(true));
    assert_eq!(runs(&key), ["prepare", "crash_once"], "prepare ran once");
    assert_eq!(
        journal(&keiro, &key).await,
        ["patch crash-fix", "step prepare", "step crash_once"]
    );
}

async fn deprecated_patches_replay_markers_and_record_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    // Recorded by v2 with the marker, resumed by v3 (deprecated patch).
    let marked = uuid::Uuid::new_v4().to_string();
    deploy(&marked, 2);
    suspend_in_sleep(&keiro, &marked, 300).await;
    deploy(&marked, 3);
    assert_eq!(resume_to_end(&keiro, &marked).await, Ok("express".into()));
    assert_eq!(runs(&marked), ["prepare", "reserve_courier", "finish"]);
    assert_eq!(
        journal(&keiro, &marked).await,
        [
            "step prepare",
            "patch courier",
            "step reserve_courier",
            "sleep sleep",
            "step finish"
        ]
    );

    // A new run under v3 records no marker and claims no step id.
    let fresh = uuid::Uuid::new_v4().to_string();
    deploy(&fresh, 3);
    let out = parcel(fresh.clone(), 1)
        .id(&fresh)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok("express".into()));
    let rows = keiro.store().load_journal(&fresh, 0).await.unwrap();
    let seqs: Vec<_> = rows.iter().map(|r| (r.seq, r.kind.as_str())).collect();
    assert_eq!(
        seqs,
        [(0, "step"), (1, "step"), (2, "sleep"), (3, "step")],
        "no marker, no gap"
    );

    // Dropping the call instead of deprecating it breaks marker journals:
    // the step now stands where the marker is.
    let dropped = uuid::Uuid::new_v4().to_string();
    deploy(&dropped, 2);
    suspend_in_sleep(&keiro, &dropped, 200).await;
    deploy(&dropped, 5);
    let err = parcel(dropped.clone(), 200)
        .id(&dropped)
        .on(&keiro)
        .await
        .unwrap_err();
    let Error::NonDeterministic {
        seq,
        expected,
        found,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (*seq, expected.as_str(), found.as_str()),
        (1, "keiro::patched(\"courier\")", "step `reserve_courier`")
    );
}

async fn another_patch_at_a_marker_is_non_determinism(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db).await;
    let key = uuid::Uuid::new_v4().to_string();
    deploy(&key, 2);
    suspend_in_sleep(&keiro, &key, 200).await;
    let before = keiro.store().load_journal(&key, 0).await.unwrap();
    // v4 renamed the patch: its marker is not the recorded one.
    deploy(&key, 4);
    let handle = keiro.handle::<Result<String, String>>(&key).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (expected, found) = loop {
        keiro.resume_once(&quiet()).await.unwrap();
        if let WorkflowStatus::NonDeterministic { expected, found } = handle.status().await.unwrap()
        {
            break (expected, found);
        }
        assert!(Instant::now() < deadline, "never set aside");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(expected, "keiro::patched(\"courier\")");
    assert_eq!(found, "keiro::patched(\"courier-v2\")");
    assert_eq!(keiro.store().load_journal(&key, 0).await.unwrap(), before);
    // Set aside: calling it again runs nothing.
    let err = parcel(key.clone(), 200)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NonDeterministic { seq: 1, .. }),
        "{err:?}"
    );
    assert_eq!(runs(&key), ["prepare", "reserve_courier"]);
}

/// The patch call with `patch_id`, in a workflow.
#[workflow]
async fn patch_named(patch_id: String) -> Result<bool, String> {
    Ok(keiro::patched(patch_id).await)
}

async fn bad_patch_ids_and_calls_outside_a_workflow_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    // Outside a workflow there is no journal: the current code runs.
    assert!(keiro::patched("courier").await);
    keiro::deprecate_patch("courier").await;

    for (patch_id, says) in [
        (String::new(), "empty".to_owned()),
        (
            "p".repeat(keiro::MAX_PATCH_ID_BYTES + 1),
            format!("limit of {} bytes", keiro::MAX_PATCH_ID_BYTES),
        ),
    ] {
        let key = uuid::Uuid::new_v4().to_string();
        let err = patch_named(patch_id).id(&key).on(&keiro).await.unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("invalid patch id") && message.contains(&says),
            "{message}"
        );
        assert_eq!(journal(&keiro, &key).await, Vec::<String>::new());
    }
    let key = uuid::Uuid::new_v4().to_string();
    let longest = "p".repeat(keiro::MAX_PATCH_ID_BYTES);
    let out = patch_named(longest).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(true));
}

async fn a_journal_with_entries_past_the_call_answers_false(backend: Backend) {
    // An instance of the old code died with a later call recorded and the
    // one where the marker would go still in flight (a `join!`): no entry
    // at that step id, but later ones. The patch answers `false` and claims
    // nothing, so the later entry still lines up.
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let input = serde_json::to_string(&(key.clone(),)).unwrap();
    let store = keiro::unstable::raw_store(&keiro);
    store
        .create_instance(&NewInstance::new(&key, "gapped", &input))
        .await
        .unwrap();
    let row = |seq: i64, name: &str, result: &str| StepRow {
        workflow_id: key.clone(),
        generation: 0,
        seq,
        name: name.into(),
        kind: "step".into(),
        result: result.into(),
    };
    store
        .append_steps(&[row(0, "prepare", "1"), row(2, "finish", "\"standard\"")])
        .await
        .unwrap();
    let out = gapped(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, (1, false, "standard".to_owned()));
    assert_eq!(
        runs(&key),
        ["reserve_courier"],
        "only the unrecorded step ran"
    );
}

/// `prepare`, the patch, then the old code's `join!` of `reserve_courier`
/// (seq 1, never recorded) and `finish` (seq 2, recorded).
#[workflow]
async fn gapped(key: String) -> (u32, bool, String) {
    let prepared = prepare(key.clone()).await;
    let patched = keiro::patched("late").await;
    let (_, finished) = tokio::join!(reserve_courier(key.clone()), finish(key, patched));
    (prepared, patched, finished)
}

async fn old_and_new_deployments_across_a_process_restart(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects");
    let effects = effects.to_str().unwrap();
    let binary = env!("CARGO_BIN_EXE_patch_worker");
    let old = format!("old-{}", uuid::Uuid::new_v4());
    let fresh = format!("fresh-{}", uuid::Uuid::new_v4());

    // The v1 process runs `old` until it suspends, then exits.
    let mut v1 = CrashChild::start(binary, &db, "patch-v1", &["v1", effects, &old], None);
    v1.line_starting("SUSPENDED").await;
    assert!(v1.exit_success().await, "the v1 process failed");

    // The v2 process resumes it and runs a fresh one.
    let mut v2 = CrashChild::start(binary, &db, "patch-v2", &["v2", effects, &fresh], None);
    v2.line_starting("READY").await;
    let keiro = db.keiro().await;
    for (id, shipped) in [(&old, "standard"), (&fresh, "express")] {
        let handle = keiro.handle::<Result<String, String>>(id).await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), handle.result())
            .await
            .unwrap_or_else(|_| panic!("{id} did not end under v2"))
            .unwrap();
        assert_eq!(out, Ok(shipped.to_owned()), "{id}");
    }
    v2.kill().await;

    let ran = |id: &str| -> Vec<String> {
        lines_of(std::path::Path::new(effects))
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("{id} ")).map(str::to_owned))
            .collect()
    };
    assert_eq!(ran(&old), ["prepare", "finish"], "old: no step re-ran");
    assert_eq!(ran(&fresh), ["prepare", "reserve_courier", "finish"]);
    assert!(!journal(&keiro, &old)
        .await
        .iter()
        .any(|e| e.starts_with("patch")));
    assert_eq!(journal(&keiro, &fresh).await[1], "patch courier");
}

on_both_backends!(
    old_instances_take_the_old_branch_new_ones_the_new,
    a_replay_after_a_crash_answers_true_again,
    deprecated_patches_replay_markers_and_record_nothing,
    another_patch_at_a_marker_is_non_determinism,
    bad_patch_ids_and_calls_outside_a_workflow_are_refused,
    a_journal_with_entries_past_the_call_answers_false,
    old_and_new_deployments_across_a_process_restart,
);
