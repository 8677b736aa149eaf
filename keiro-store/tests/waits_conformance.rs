//! Conformance of the waiting primitives' storage, on both backends:
//! suspension, awakeable resolution, children reporting to parents,
//! cancellation cascades and continue-as-new.

#[macro_use]
mod support;

use keiro_store::{
    now_us, Cancellation, ContinueAsNew, Crash, CreateRequest, Finish, FinishRequest,
    InstanceStatus, JournalWriter, Lease, NewInstance, ParentLink, Resolution, StepRow, Store,
    Suspend,
};
use support::{completed, TestDb};

conformance!(
    suspend_keeps_the_wake_time_and_drops_the_lease,
    suspend_awaiting_a_recorded_step_is_due_at_once,
    resolve_records_once_and_wakes_a_suspended_waiter,
    resolve_of_an_unknown_awaitable_is_refused,
    resolve_of_an_ended_instance_records_nothing,
    a_finished_child_reports_to_its_suspended_parent,
    a_child_failed_by_crashes_reports_its_failure,
    cancel_cascades_to_unfinished_descendants_and_reports_up,
    cancel_of_a_finished_or_missing_instance_changes_nothing,
    continue_as_new_starts_the_next_generation_and_keeps_the_old_journal,
    the_writer_batches_creates_steps_and_finishes_of_many_workflows,
    a_refused_write_fails_only_its_caller_in_a_mixed_round,
    pending_awakeables_count_the_unanswered_of_unfinished_generations,
    next_wake_at_is_the_earliest_of_the_unfinished,
);

const OWNER: &str = "w1";

fn lease() -> Lease<'static> {
    Lease {
        owner: OWNER,
        ttl_us: 60_000_000,
    }
}

async fn running(db: &TestDb, id: &str, parent: Option<ParentLink<'_>>) {
    let new = NewInstance {
        parent,
        lease: Some(lease()),
        ..NewInstance::new(id, "flow", "[]")
    };
    assert!(db.store.create_instance(&new).await.unwrap().1);
}

fn row(id: &str, generation: i64, seq: i64, kind: &str, result: &str) -> StepRow {
    StepRow {
        workflow_id: id.into(),
        generation,
        seq,
        name: "x".into(),
        kind: kind.into(),
        result: result.into(),
    }
}

/// Suspends generation 0 of instance `wf` held by `owner`; whether it applied.
async fn suspend_wf(db: &TestDb, owner: &str, wake_at: Option<i64>, awaiting: Option<i64>) -> bool {
    db.store
        .suspend(&Suspend {
            id: "wf",
            generation: 0,
            owner,
            wake_at,
            awaiting,
            waiting: None,
        })
        .await
        .unwrap()
}

/// Records one step.
async fn append(db: &TestDb, row: StepRow) {
    db.store.append_steps(&[row]).await.unwrap();
}

/// Continues generation 0 of `wf` as new with `input`, as `owner`; whether
/// it applied.
async fn continue_wf(db: &TestDb, owner: &str, input: &str) -> bool {
    db.store
        .continue_as_new(&ContinueAsNew {
            id: "wf",
            generation: 0,
            owner,
            input,
            app_version: None,
        })
        .await
        .unwrap()
}

async fn due_ids(db: &TestDb) -> Vec<String> {
    let mut ids: Vec<_> = db
        .store
        .find_due(100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    ids.sort();
    ids
}

async fn suspend_keeps_the_wake_time_and_drops_the_lease(db: &TestDb) {
    running(db, "wf", None).await;
    let later = now_us() + 60_000_000;
    assert!(!suspend_wf(db, "intruder", Some(later), None).await);
    assert!(suspend_wf(db, OWNER, Some(later), None).await);
    let got = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(got.status, InstanceStatus::Suspended);
    assert_eq!(
        (got.wake_at, got.lease_owner.as_deref()),
        (Some(later), None)
    );
    assert!(
        due_ids(db).await.is_empty(),
        "a future wake time is not due"
    );
    // Suspending again needs the lease (claim first).
    assert!(!suspend_wf(db, OWNER, Some(later), None).await);
    // Without a wake time it is never due by time.
    assert!(db.store.claim("wf", lease()).await.unwrap().is_some());
    assert!(suspend_wf(db, OWNER, None, Some(5)).await);
    let got = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(got.wake_at, None);
    assert!(due_ids(db).await.is_empty());
}

async fn suspend_awaiting_a_recorded_step_is_due_at_once(db: &TestDb) {
    running(db, "wf", None).await;
    // The awaited step was recorded while the run was deciding to suspend.
    append(db, row("wf", 0, 3, "resolution", "1")).await;
    assert!(suspend_wf(db, OWNER, None, Some(3)).await);
    assert_eq!(due_ids(db).await, ["wf"]);
}

async fn resolve_records_once_and_wakes_a_suspended_waiter(db: &TestDb) {
    running(db, "wf", None).await;
    append(db, row("wf", 0, 0, "awakeable", "\"bool\"")).await;
    assert!(suspend_wf(db, OWNER, None, Some(1)).await);
    assert!(due_ids(db).await.is_empty());
    let first = row("wf", 0, 1, "resolution", r#"{"Ok":true}"#);
    assert_eq!(
        db.store.resolve(0, "awakeable", &first).await.unwrap(),
        Resolution::Recorded
    );
    assert_eq!(due_ids(db).await, ["wf"], "resolution makes the waiter due");
    let second = row("wf", 0, 1, "resolution", r#"{"Ok":false}"#);
    assert_eq!(
        db.store.resolve(0, "awakeable", &second).await.unwrap(),
        Resolution::AlreadyResolved(first.clone())
    );
    assert_eq!(db.store.get_step("wf", 0, 1).await.unwrap(), Some(first));
}

async fn resolve_of_an_unknown_awaitable_is_refused(db: &TestDb) {
    running(db, "wf", None).await;
    let answer = row("wf", 0, 1, "resolution", "1");
    assert_eq!(
        db.store.resolve(0, "awakeable", &answer).await.unwrap(),
        Resolution::Unknown
    );
    // A step of another kind at that seq is not an awakeable either.
    append(db, row("wf", 0, 0, "step", "1")).await;
    assert_eq!(
        db.store.resolve(0, "awakeable", &answer).await.unwrap(),
        Resolution::Unknown
    );
    assert_eq!(db.store.get_step("wf", 0, 1).await.unwrap(), None);
}

async fn resolve_of_an_ended_instance_records_nothing(db: &TestDb) {
    for (id, status) in [
        ("done", InstanceStatus::Completed),
        ("gone", InstanceStatus::Cancelled),
    ] {
        running(db, id, None).await;
        append(db, row(id, 0, 0, "awakeable", "\"bool\"")).await;
        append(db, row(id, 0, 2, "awakeable", "\"bool\"")).await;
        // One awakeable answered while it ran, the other never.
        let early = row(id, 0, 1, "resolution", r#"{"Ok":true}"#);
        assert_eq!(
            db.store.resolve(0, "awakeable", &early).await.unwrap(),
            Resolution::Recorded
        );
        match status {
            InstanceStatus::Cancelled => {
                db.store.cancel(id).await.unwrap();
            }
            _ => {
                let finish = Finish {
                    id,
                    generation: 0,
                    owner: OWNER,
                    status,
                    output: Some("1"),
                    error: None,
                };
                assert!(db.store.finish(&finish).await.unwrap());
            }
        }
        let late = row(id, 0, 3, "resolution", r#"{"Ok":true}"#);
        assert_eq!(
            db.store.resolve(2, "awakeable", &late).await.unwrap(),
            Resolution::Finished(status)
        );
        assert_eq!(db.store.get_step(id, 0, 3).await.unwrap(), None);
        // The answer given before the end still stands.
        let again = row(id, 0, 1, "resolution", r#"{"Ok":false}"#);
        assert_eq!(
            db.store.resolve(0, "awakeable", &again).await.unwrap(),
            Resolution::AlreadyResolved(early)
        );
    }
}

async fn a_finished_child_reports_to_its_suspended_parent(db: &TestDb) {
    running(db, "parent", None).await;
    let link = ParentLink {
        id: "parent",
        generation: 0,
        seq: 4,
    };
    running(db, "parent/4", Some(link)).await;
    assert!(db
        .store
        .suspend(&Suspend {
            id: "parent",
            generation: 0,
            owner: OWNER,
            wake_at: None,
            awaiting: Some(4),
            waiting: None,
        })
        .await
        .unwrap());
    let done = Finish {
        id: "parent/4",
        generation: 0,
        owner: OWNER,
        status: InstanceStatus::Completed,
        output: Some(r#"{"label":"x"}"#),
        error: None,
    };
    assert!(db.store.finish(&done).await.unwrap());
    let reported = db.store.get_step("parent", 0, 4).await.unwrap().unwrap();
    assert_eq!(
        (reported.kind.as_str(), reported.name.as_str()),
        ("child", "flow")
    );
    let value: serde_json::Value = serde_json::from_str(&reported.result).unwrap();
    assert_eq!(value, serde_json::json!({ "Ok": { "label": "x" } }));
    assert_eq!(due_ids(db).await, ["parent"]);
}

async fn a_child_failed_by_crashes_reports_its_failure(db: &TestDb) {
    running(db, "parent", None).await;
    let link = ParentLink {
        id: "parent",
        generation: 0,
        seq: 0,
    };
    running(db, "parent/0", Some(link)).await;
    let crash = Crash {
        id: "parent/0",
        owner: OWNER,
        error: "boom",
        max_attempts: 1,
        retry_at: now_us(),
    };
    let (status, attempts) = db.store.record_crash(&crash).await.unwrap().unwrap();
    assert_eq!((status, attempts), (InstanceStatus::Failed, 1));
    let reported = db.store.get_step("parent", 0, 0).await.unwrap().unwrap();
    let value: serde_json::Value = serde_json::from_str(&reported.result).unwrap();
    assert_eq!(
        value,
        serde_json::json!({ "Err": { "status": "failed", "message": "boom" } })
    );
}

async fn cancel_cascades_to_unfinished_descendants_and_reports_up(db: &TestDb) {
    running(db, "root", None).await;
    running(
        db,
        "mid",
        Some(ParentLink {
            id: "root",
            generation: 0,
            seq: 0,
        }),
    )
    .await;
    running(
        db,
        "leaf",
        Some(ParentLink {
            id: "mid",
            generation: 0,
            seq: 2,
        }),
    )
    .await;
    running(
        db,
        "done",
        Some(ParentLink {
            id: "mid",
            generation: 0,
            seq: 3,
        }),
    )
    .await;
    assert!(db.store.finish(&completed("done")).await.unwrap());
    running(db, "bystander", None).await;
    let Cancellation::Cancelled(ids) = db.store.cancel("mid").await.unwrap() else {
        panic!("expected a cancellation");
    };
    assert_eq!(ids[0], "mid");
    let mut rest = ids[1..].to_vec();
    rest.sort();
    assert_eq!(rest, ["leaf"]);
    for id in ["mid", "leaf"] {
        let got = db.store.get_instance(id).await.unwrap().unwrap();
        assert_eq!(
            (got.status, got.lease_owner),
            (InstanceStatus::Cancelled, None),
            "{id}"
        );
    }
    for (id, status) in [
        ("done", InstanceStatus::Completed),
        ("root", InstanceStatus::Running),
        ("bystander", InstanceStatus::Running),
    ] {
        assert_eq!(
            db.store.get_instance(id).await.unwrap().unwrap().status,
            status,
            "{id}"
        );
    }
    // The root awaiting `mid` and `mid` awaiting `leaf` hear of it.
    let to_root = db.store.get_step("root", 0, 0).await.unwrap().unwrap();
    assert!(to_root.result.contains("cancelled"), "{}", to_root.result);
    let to_mid = db.store.get_step("mid", 0, 2).await.unwrap().unwrap();
    assert!(to_mid.result.contains("cancelled"), "{}", to_mid.result);
}

async fn cancel_of_a_finished_or_missing_instance_changes_nothing(db: &TestDb) {
    running(db, "wf", None).await;
    assert!(db.store.finish(&completed("wf")).await.unwrap());
    assert_eq!(
        db.store.cancel("wf").await.unwrap(),
        Cancellation::AlreadyFinal(InstanceStatus::Completed)
    );
    assert_eq!(
        db.store.cancel("nope").await.unwrap(),
        Cancellation::NotFound
    );
    let got = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.output.as_deref()),
        (InstanceStatus::Completed, Some("1"))
    );
}

async fn continue_as_new_starts_the_next_generation_and_keeps_the_old_journal(db: &TestDb) {
    running(db, "wf", None).await;
    append(db, row("wf", 0, 0, "step", "1")).await;
    assert!(!continue_wf(db, "intruder", "[2]").await);
    assert!(continue_wf(db, OWNER, "[2]").await);
    let got = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(
        (got.generation, got.status, got.input.as_str()),
        (1, InstanceStatus::Pending, "[2]")
    );
    assert_eq!(got.lease_owner, None);
    assert_eq!(due_ids(db).await, ["wf"]);
    assert!(db.store.load_journal("wf", 1).await.unwrap().is_empty());
    assert_eq!(db.store.load_journal("wf", 0).await.unwrap().len(), 1);
    // The old generation cannot continue again.
    assert!(!continue_wf(db, OWNER, "[3]").await);
}

async fn the_writer_batches_creates_steps_and_finishes_of_many_workflows(db: &TestDb) {
    let writer = JournalWriter::spawn(db.store.clone());
    let mut tasks = Vec::new();
    for n in 0..100 {
        let writer = writer.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("wf-{n}");
            let create = leased_create(&id);
            let (row, created) = writer.create(create.clone()).await.unwrap();
            assert!(created && row.status == InstanceStatus::Running);
            // A second create of the same id finds the first.
            assert!(!writer.create(create).await.unwrap().1);
            writer.append(row_of(&id, 0)).await.unwrap();
            let finish = FinishRequest {
                id: id.clone(),
                generation: 0,
                owner: OWNER.into(),
                status: InstanceStatus::Completed,
                output: Some(n.to_string()),
                error: None,
            };
            assert!(writer.finish(finish.clone()).await.unwrap());
            assert!(!writer.finish(finish).await.unwrap(), "finished twice");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for n in [0, 57, 99] {
        let id = format!("wf-{n}");
        let got = db.store.get_instance(&id).await.unwrap().unwrap();
        assert_eq!(
            (got.status, got.output),
            (InstanceStatus::Completed, Some(n.to_string()))
        );
        assert_eq!(db.store.load_journal(&id, 0).await.unwrap().len(), 1);
    }
}

/// A writer round holding a new instance, step rows and a finish in which
/// the store refuses the new instance answers that caller with the error
/// and writes the others.
async fn a_refused_write_fails_only_its_caller_in_a_mixed_round(db: &TestDb) {
    running(db, "wf", None).await;
    let writer = JournalWriter::spawn(db.store.clone());
    // On SQLite, a write lock held elsewhere keeps the writer's first round
    // waiting while the writes below queue, so they make the next round
    // together.
    let mut held = match &db.store {
        Store::Sqlite(s) => {
            let mut conn = s.pool().acquire().await.unwrap();
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *conn)
                .await
                .unwrap();
            Some(conn)
        }
        Store::Postgres(_) => None,
    };
    let first = tokio::spawn({
        let writer = writer.clone();
        async move { writer.append(row_of("wf", 0)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let refused = tokio::spawn({
        let writer = writer.clone();
        async move { writer.create(leased_create("bad\0id")).await }
    });
    let appended = tokio::spawn({
        let writer = writer.clone();
        async move { writer.append(row_of("wf", 1)).await }
    });
    let finished = tokio::spawn({
        let writer = writer.clone();
        async move {
            writer
                .finish(FinishRequest {
                    id: "wf".into(),
                    generation: 0,
                    owner: OWNER.into(),
                    status: InstanceStatus::Completed,
                    output: Some("7".into()),
                    error: None,
                })
                .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    if let Some(conn) = held.as_mut() {
        sqlx::query("ROLLBACK").execute(&mut **conn).await.unwrap();
    }
    drop(held);
    first.await.unwrap().unwrap();
    let error = refused.await.unwrap().unwrap_err();
    assert!(
        matches!(error, keiro_store::StoreError::InvalidId { .. }),
        "{error:?}"
    );
    appended.await.unwrap().unwrap();
    assert!(finished.await.unwrap().unwrap(), "the finish applied");
    assert_eq!(db.store.load_journal("wf", 0).await.unwrap().len(), 2);
    let wf = db.store.get_instance("wf").await.unwrap().unwrap();
    assert_eq!(
        (wf.status, wf.output.as_deref()),
        (InstanceStatus::Completed, Some("7"))
    );
}

/// The writer's create of instance `id` of `flow`, leased to [`OWNER`].
fn leased_create(id: &str) -> CreateRequest {
    CreateRequest {
        lease: Some((OWNER.into(), 60_000_000)),
        ..CreateRequest::new(id, "flow", "[]")
    }
}

fn row_of(id: &str, seq: i64) -> StepRow {
    row(id, 0, seq, "step", "1")
}

/// The pending-awakeables gauge (read at every resume pass) counts an
/// awakeable only while it has no answer and its instance's current
/// generation is unfinished.
async fn pending_awakeables_count_the_unanswered_of_unfinished_generations(db: &TestDb) {
    assert_eq!(db.store.count_pending_awakeables().await.unwrap(), 0);
    // `open`: one awakeable unanswered, one answered (an awakeable at `n`
    // keeps `n + 1` for its answer), one plain step.
    running(db, "open", None).await;
    append(db, row("open", 0, 0, "awakeable", "\"bool\"")).await;
    append(db, row("open", 0, 2, "awakeable", "\"bool\"")).await;
    let answer = row("open", 0, 3, "resolution", r#"{"Ok":true}"#);
    assert_eq!(
        db.store.resolve(2, "awakeable", &answer).await.unwrap(),
        Resolution::Recorded
    );
    append(db, row("open", 0, 4, "step", "1")).await;
    // `ended`: an awakeable never answered, then the instance ended.
    running(db, "ended", None).await;
    append(db, row("ended", 0, 0, "awakeable", "\"bool\"")).await;
    assert!(db.store.finish(&completed("ended")).await.unwrap());
    // `wf`: an awakeable of generation 0, which continued as new.
    running(db, "wf", None).await;
    append(db, row("wf", 0, 0, "awakeable", "\"bool\"")).await;
    assert!(continue_wf(db, OWNER, "[2]").await);
    assert_eq!(db.store.count_pending_awakeables().await.unwrap(), 1);
    // The new generation's own awakeable counts.
    append(db, row("wf", 1, 0, "awakeable", "\"bool\"")).await;
    assert_eq!(db.store.count_pending_awakeables().await.unwrap(), 2);
}

/// The earliest wake-up time among unfinished instances: none without any,
/// then a suspended instance's, ahead of a running one's lease expiry; a
/// finished instance has none.
async fn next_wake_at_is_the_earliest_of_the_unfinished(db: &TestDb) {
    assert_eq!(db.store.next_wake_at().await.unwrap(), None);
    running(db, "wf", None).await;
    let lease_end = db.store.next_wake_at().await.unwrap();
    assert!(
        lease_end.is_some(),
        "a running instance wakes at its lease's end"
    );
    let soon = now_us() + 10_000_000;
    assert!(suspend_wf(db, OWNER, Some(soon), None).await);
    running(db, "other", None).await;
    assert_eq!(db.store.next_wake_at().await.unwrap(), Some(soon));
    assert!(db.store.finish(&completed("other")).await.unwrap());
    assert_eq!(db.store.next_wake_at().await.unwrap(), Some(soon));
    db.store.cancel("wf").await.unwrap();
    assert_eq!(db.store.next_wake_at().await.unwrap(), None);
}
