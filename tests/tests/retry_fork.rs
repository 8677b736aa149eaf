//! Retry and fork from outside, on both backends: a crash-failed instance
//! runs again from its journal under a resume worker without re-running its
//! journaled steps; other statuses are refused naming theirs; a fork from
//! step 3 of a five-step workflow runs steps 3 to 5 only, under a new id.

use std::collections::HashSet;
use std::sync::Mutex;

use keiro::{step, workflow, Error, ForkFrom, ResumeOptions, WorkflowStatus};
use keiro_store::{Lease, NewInstance, Store, StoreOptions};
use keiro_tests::{count, on_both_backends, ran, runs, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

/// Keys whose run of `retry_five` panics after step 2.
static PANIC_AFTER_TWO: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn set_panic(key: &str, on: bool) {
    let mut keys = PANIC_AFTER_TWO.lock().unwrap();
    let keys = keys.get_or_insert_with(HashSet::new);
    if on {
        keys.insert(key.to_owned());
    } else {
        keys.remove(key);
    }
}

fn panics(key: &str) -> bool {
    PANIC_AFTER_TWO
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|keys| keys.contains(key))
}

#[step]
async fn numbered(key: String, n: u32) -> u32 {
    ran(&key, &format!("step {n}"));
    n
}

/// Five steps, journaled at seq 0..=4.
#[workflow]
async fn retry_five(key: String) -> u32 {
    let mut sum = numbered(key.clone(), 1).await;
    sum += numbered(key.clone(), 2).await;
    if panics(&key) {
        panic!("crash after step 2 of {key}");
    }
    for n in 3..=5 {
        sum += numbered(key.clone(), n).await;
    }
    sum
}

fn steps_ran(key: &str) -> Vec<usize> {
    (1..=5).map(|n| count(key, &format!("step {n}"))).collect()
}

async fn retry_runs_a_crash_failed_instance_from_its_journal(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.builder().max_attempts(1).connect().await.unwrap();
    let key = format!("retry-{}", uuid::Uuid::new_v4().simple());
    set_panic(&key, true);
    let handle = retry_five(key.clone())
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.failed, 1);
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Failed);
    assert_eq!(steps_ran(&key), [1, 1, 0, 0, 0]);

    set_panic(&key, false);
    keiro.retry(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Pending);
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!((summary.resumed, summary.completed), (1, 1));
    assert_eq!(handle.result().await.unwrap(), 15);
    // Steps 1 and 2 were journaled: the retry replayed them.
    assert_eq!(steps_ran(&key), [1, 1, 1, 1, 1]);
    assert_eq!(
        runs(&key),
        ["step 1", "step 2", "step 3", "step 4", "step 5"]
    );

    // Completed now: a second retry is refused, naming the status.
    let error = keiro.retry(&key).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotRetryable { status, id, name }
            if status == "completed" && id == &key && name == "retry_five"),
        "{error:?}"
    );
    assert!(error
        .to_string()
        .contains("is completed and cannot be retried"));
}

async fn retry_of_a_cancelled_instance_runs_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("cancelled-{}", uuid::Uuid::new_v4().simple());
    let handle = retry_five(key.clone())
        .id(&key)
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    keiro.cancel(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Cancelled);
    keiro.retry(&key).await.unwrap();
    keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(handle.result().await.unwrap(), 15);
    assert_eq!(steps_ran(&key), [1, 1, 1, 1, 1]);
}

async fn retry_refuses_running_and_unknown_instances(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = Store::connect(&db.url, &StoreOptions::default())
        .await
        .unwrap();
    let new = NewInstance {
        id: "held",
        name: "retry_five",
        input: "[\"held\"]",
        signature: None,
        parent: None,
        lease: Some(Lease {
            owner: "elsewhere",
            ttl_us: 60_000_000,
        }),
        deadline: None,
        traceparent: None,
        app_version: None,
        skeleton_hash: None,
    };
    store.create_instance(&new).await.unwrap();
    let error = keiro.retry("held").await.unwrap_err();
    assert!(
        matches!(&error, Error::NotRetryable { status, .. } if status == "running"),
        "{error:?}"
    );
    let row = store.get_instance("held").await.unwrap().unwrap();
    assert_eq!(row.lease_owner.as_deref(), Some("elsewhere"));
    let error = keiro.retry("nobody").await.unwrap_err();
    assert!(
        matches!(&error, Error::NotFound { id } if id == "nobody"),
        "{error:?}"
    );
    store.close().await;
}

async fn fork_from_step_three_runs_steps_three_to_five(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("fork-{}", uuid::Uuid::new_v4().simple());
    let handle = retry_five(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    assert_eq!(handle.result().await.unwrap(), 15);
    assert_eq!(steps_ran(&key), [1, 1, 1, 1, 1]);

    // Step 3 is journaled at seq 2: the fork keeps seqs 0 and 1.
    let new_id = keiro.fork(&key, ForkFrom::Step(2)).await.unwrap();
    assert!(new_id.starts_with(&format!("{key}-fork-")), "{new_id}");
    let forked = keiro.handle::<u32>(&new_id).await.unwrap();
    assert_eq!(forked.status().await.unwrap(), WorkflowStatus::Pending);
    let summary = keiro.resume_once(&quiet()).await.unwrap();
    assert_eq!(summary.completed, 1);
    assert_eq!(forked.result().await.unwrap(), 15);
    // Same input (the same key): steps 1 and 2 were not run again.
    assert_eq!(steps_ran(&key), [1, 1, 2, 2, 2]);
    // The source is untouched.
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);

    // A chosen id; a taken one is a conflict.
    keiro
        .fork_as(&key, ForkFrom::Step(5), "fork-chosen")
        .await
        .unwrap();
    let error = keiro
        .fork_as(&key, ForkFrom::Step(1), "fork-chosen")
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::IdConflict { id, .. } if id == "fork-chosen"),
        "{error:?}"
    );
    keiro.resume_once(&quiet()).await.unwrap();
    let chosen = keiro.handle::<u32>("fork-chosen").await.unwrap();
    assert_eq!(chosen.result().await.unwrap(), 15);
    assert_eq!(
        steps_ran(&key),
        [1, 1, 2, 2, 2],
        "a full replay ran nothing"
    );
}

async fn fork_builder_takes_a_chosen_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("fork-id-{}", uuid::Uuid::new_v4().simple());
    let handle = retry_five(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    assert_eq!(handle.result().await.unwrap(), 15);

    let chosen = format!("{key}-b");
    let new_id = keiro
        .fork(&key, ForkFrom::Step(3))
        .id(chosen.clone())
        .await
        .unwrap();
    assert_eq!(new_id, chosen);
    // The same id again is a conflict, through the builder as through fork_as.
    let error = keiro
        .fork(&key, ForkFrom::Step(1))
        .id(chosen.as_str())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::IdConflict { id, .. } if *id == chosen),
        "{error:?}"
    );
    keiro.resume_once(&quiet()).await.unwrap();
    let forked = keiro.handle::<u32>(&chosen).await.unwrap();
    assert_eq!(forked.result().await.unwrap(), 15);
    // Seqs 0..=2 were copied: only steps 4 and 5 ran again.
    assert_eq!(steps_ran(&key), [1, 1, 1, 2, 2]);
}

async fn fork_of_an_unknown_id_is_not_found(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let error = keiro.fork("nobody", ForkFrom::Step(1)).await.unwrap_err();
    assert!(
        matches!(&error, Error::NotFound { id } if id == "nobody"),
        "{error:?}"
    );
}

on_both_backends!(
    retry_runs_a_crash_failed_instance_from_its_journal,
    retry_of_a_cancelled_instance_runs_it,
    retry_refuses_running_and_unknown_instances,
    fork_from_step_three_runs_steps_three_to_five,
    fork_builder_takes_a_chosen_id,
    fork_of_an_unknown_id_is_not_found,
);
