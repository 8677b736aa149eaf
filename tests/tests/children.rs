//! Child workflows on both backends: deterministic ids, results journaled in
//! the parent, failures delivered as errors, a suspended parent woken by its
//! child's end, fan-out of 100 children joined in order.

use std::time::Duration;

use keiro::{step, workflow, Error, Keiro, ResumeOptions, WorkflowStatus};
use keiro_store::{Lease, NewInstance, ParentLink};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

fn quiet() -> ResumeOptions {
    ResumeOptions::default().log(|_| {})
}

async fn runtime(db: &TestDb, suspend_after: Duration) -> Keiro {
    Keiro::builder(&db.url)
        .executor_id(format!("ch-{}", uuid::Uuid::new_v4().simple()))
        .suspend_after(suspend_after)
        .max_attempts(2)
        .connect()
        .await
        .unwrap()
}

#[step]
async fn square(key: String, n: u64) -> u64 {
    ran(&key, &format!("square {n}"));
    n * n
}

#[workflow]
async fn squarer(key: String, n: u64) -> u64 {
    square(key, n).await
}

#[workflow]
async fn fan_out(key: String, n: u64) -> u64 {
    let mut children = Vec::new();
    for i in 0..n {
        children.push(keiro::spawn(squarer(key.clone(), i)).await.unwrap());
    }
    let mut total = 0;
    for child in children {
        total += child.await.unwrap();
    }
    total
}

async fn a_fan_out_of_100_children_is_joined_in_order(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(5)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let total = fan_out(key.clone(), 100).id(&key).on(&keiro).await.unwrap();
    assert_eq!(total, (0..100u64).map(|i| i * i).sum::<u64>());
    for i in [0, 42, 99] {
        assert_eq!(count(&key, &format!("square {i}")), 1);
        let child = keiro
            .store()
            .get_instance(&format!("{key}/{i}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (child.parent_id.as_deref(), child.parent_seq),
            (Some(key.as_str()), Some(i as i64))
        );
    }
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal.len(), 100);
    assert!(journal
        .iter()
        .all(|r| r.kind == "child" && r.name == "squarer"));
    // Replaying the finished parent runs nothing again.
    assert_eq!(
        fan_out(key.clone(), 100).id(&key).on(&keiro).await.unwrap(),
        total
    );
    assert_eq!(count(&key, "square 7"), 1);
}

#[workflow]
async fn picky(key: String, n: u64) -> Result<u64, String> {
    square(key, n).await;
    if n % 2 == 1 {
        return Err(format!("{n} is odd"));
    }
    Ok(n)
}

#[workflow]
async fn crashing_child(key: String) -> u64 {
    ran(&key, "crashing_child");
    panic!("child {key} always crashes")
}

#[workflow]
async fn parent_of_failures(key: String) -> (Result<u64, String>, String) {
    // A child that returns Err is a finished child: its value is the Err.
    let returned = picky(key.clone(), 3).await.unwrap();
    // A child that crashes until it is marked failed is an error here.
    let failed = crashing_child(key).await.unwrap_err();
    (returned, failed.to_string())
}

async fn child_failures_reach_the_parent(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(200)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = parent_of_failures(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    // The crashing child is retried by a worker until its attempts run out.
    let worker = keiro
        // Its crash attempts are the runtime's (`max_attempts(2)`).
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let (returned, failed) = tokio::time::timeout(Duration::from_secs(30), handle.result())
        .await
        .unwrap()
        .unwrap();
    worker.shutdown().await;
    assert_eq!(returned, Err("3 is odd".to_string()));
    assert!(
        failed.contains("crashing_child") && failed.contains("always crashes"),
        "{failed}"
    );
    let child = keiro.handle::<u64>(format!("{key}/1")).await.unwrap();
    assert_eq!(child.status().await.unwrap(), WorkflowStatus::Failed);
    assert_eq!(count(&key, "crashing_child"), 2);
}

#[step]
async fn slow_step(key: String) -> u64 {
    tokio::time::sleep(Duration::from_millis(600)).await;
    ran(&key, "slow_step");
    7
}

#[workflow]
async fn slow_child(key: String) -> u64 {
    slow_step(key).await
}

#[workflow]
async fn patient_parent(key: String) -> u64 {
    square(key.clone(), 1).await;
    slow_child(key).await.unwrap() + 1
}

async fn a_suspended_parent_is_woken_by_its_childs_end(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(100)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let handle = patient_parent(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let mut suspended = false;
    for _ in 0..50 {
        if handle.status().await.unwrap() == WorkflowStatus::Suspended {
            suspended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(suspended, "the parent never suspended while its child ran");
    let row = keiro.store().get_instance(&key).await.unwrap().unwrap();
    assert_eq!(row.wake_at, None);
    // The child's completion journals the parent's step and makes it due.
    let worker = db.keiro().await;
    for _ in 0..100 {
        worker.resume_once(&quiet()).await.unwrap();
        if handle.status().await.unwrap() == WorkflowStatus::Completed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(handle.result().await.unwrap(), 8);
    assert_eq!((count(&key, "square 1"), count(&key, "slow_step")), (1, 1));
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal[1].kind, "child");
}

async fn a_child_with_no_steps_is_driven_by_the_worker(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_millis(100)).await;
    let key = uuid::Uuid::new_v4().to_string();
    // A parent suspended on a child whose creator died before it ran a step.
    let parent_input = serde_json::to_string(&(key.clone(),)).unwrap();
    let dead = Lease {
        owner: "dead",
        ttl_us: -1,
    };
    let store = keiro::unstable::raw_store(&keiro);
    store
        .create_instance(&NewInstance {
            lease: Some(dead),
            ..NewInstance::new(&key, "patient_parent", &parent_input)
        })
        .await
        .unwrap();
    let child_id = format!("{key}/1");
    let child_input = serde_json::to_string(&(key.clone(),)).unwrap();
    let link = ParentLink {
        id: &key,
        generation: 0,
        seq: 1,
    };
    store
        .create_instance(&NewInstance {
            parent: Some(link),
            lease: Some(dead),
            ..NewInstance::new(&child_id, "slow_child", &child_input)
        })
        .await
        .unwrap();
    let handle = keiro.handle::<u64>(&key).await.unwrap();
    let mut passes = 0;
    while handle.status().await.unwrap() != WorkflowStatus::Completed {
        keiro.resume_once(&quiet()).await.unwrap();
        passes += 1;
        assert!(passes < 200, "never completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(handle.result().await.unwrap(), 8);
    assert_eq!(count(&key, "slow_step"), 1);
}

#[workflow]
async fn spawner(key: String) -> u64 {
    let _ = keiro::spawn(squarer(key, 3)).await;
    0
}

async fn spawn_outside_a_workflow_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::from_secs(1)).await;
    let err = keiro::spawn(squarer("k".into(), 2).on(&keiro))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NotInWorkflow { .. }) && err.to_string().contains(".start()"),
        "{err}"
    );
    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(spawner(key.clone()).id(&key).on(&keiro).await.unwrap(), 0);
}

on_both_backends!(
    a_fan_out_of_100_children_is_joined_in_order,
    child_failures_reach_the_parent,
    a_suspended_parent_is_woken_by_its_childs_end,
    a_child_with_no_steps_is_driven_by_the_worker,
    spawn_outside_a_workflow_is_refused,
    parents_suspending_as_their_children_end_are_all_woken,
);

#[workflow]
async fn awaiting_parent(key: String, n: u64) -> u64 {
    squarer(key, n).await.unwrap() + 1
}

/// Many parents suspend (at once: `suspend_after` zero) just as their
/// children end, in parallel: each child's end is either seen by its
/// parent's suspension or finds the parent suspended and makes it due. A
/// lost wake-up leaves a parent suspended with no wake time, forever.
async fn parents_suspending_as_their_children_end_are_all_woken(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = runtime(&db, Duration::ZERO).await;
    let worker = keiro
        .resume_worker(quiet().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let mut handles = Vec::new();
    for n in 0..60u64 {
        let id = format!("{key}-{n}");
        handles.push(
            awaiting_parent(key.clone(), n)
                .id(&id)
                .on(&keiro)
                .start()
                .await
                .unwrap(),
        );
    }
    for (n, handle) in handles.into_iter().enumerate() {
        let n = n as u64;
        let result = tokio::time::timeout(Duration::from_secs(60), handle.result())
            .await
            .unwrap_or_else(|_| panic!("parent {key}-{n} was never woken by its child's end"))
            .unwrap();
        assert_eq!(result, n * n + 1);
    }
    worker.shutdown().await;
}
