//! A queued instance's finish hands its slot over to the next instance of
//! its partition in the same commit (`Store::finish_handing_over`), on both
//! backends: which successor it takes, what it never takes, and that
//! concurrent hand-overs never take one successor twice.

#[macro_use]
mod support;

use keiro_store::{
    Finish, HandOver, InstanceRow, InstanceStatus, NewInstance, ParentLink, QueueLimits, Queued,
    Registered, Retry, Store,
};
use support::{lease, TestDb, OWNER};

/// An executor other than [`OWNER`].
const OTHER: &str = "w2";

const QUEUE: &str = "q";
const FLOW: Registered<'static> = Registered {
    name: "flow",
    signature: "sig",
};
const VERSIONS: &[&str] = &["v1"];

/// One instance to put on the queue.
struct Job<'a> {
    id: &'a str,
    name: &'a str,
    partition: &'a str,
    priority: i64,
    signature: Option<&'a str>,
    app_version: Option<&'a str>,
    not_before: Option<i64>,
    parent: Option<ParentLink<'a>>,
    deadline: Option<i64>,
}

impl<'a> Job<'a> {
    /// Instance `id` of [`FLOW`] in partition `partition` at priority 0.
    fn new(id: &'a str, partition: &'a str) -> Job<'a> {
        Job {
            id,
            name: FLOW.name,
            partition,
            priority: 0,
            signature: Some(FLOW.signature),
            app_version: Some("v1"),
            not_before: None,
            parent: None,
            deadline: None,
        }
    }

    /// The instance as recorded (without its place on the queue).
    fn new_instance(&self) -> NewInstance<'a> {
        NewInstance {
            signature: self.signature,
            parent: self.parent,
            app_version: self.app_version,
            deadline: self.deadline,
            ..NewInstance::new(self.id, self.name, "[]")
        }
    }

    async fn enqueue(self, store: &Store) {
        let new = self.new_instance();
        let queued = Queued {
            queue: Some(QUEUE),
            priority: self.priority,
            partition: self.partition,
            dedup: None,
            not_before: self.not_before,
        };
        let (_, created) = store.create_queued(&new, &queued).await.unwrap();
        assert!(created, "{} is new", self.id);
    }
}

/// Claims up to `n` of the queue's instances for [`OWNER`] under a
/// concurrency of `n`.
async fn claim(store: &Store, n: i64) -> Vec<String> {
    let limits = QueueLimits {
        name: QUEUE,
        concurrency: Some(n),
        worker_concurrency: None,
        rate_limit: None,
    };
    let rows = store
        .claim_queue(lease(), &[FLOW], VERSIONS, &limits, n)
        .await
        .unwrap();
    rows.into_iter().map(|row| row.id).collect()
}

/// [`QUEUE`]'s limits: `concurrency` and `worker_concurrency` as given.
fn limits(concurrency: Option<i64>, worker_concurrency: Option<i64>) -> QueueLimits<'static> {
    QueueLimits {
        name: QUEUE,
        concurrency,
        worker_concurrency,
        rate_limit: None,
    }
}

/// A hand-over on [`QUEUE`] with no concurrency limits.
fn hand_over() -> HandOver {
    hand_over_within(None, None)
}

/// A hand-over on [`QUEUE`] within these limits.
fn hand_over_within(concurrency: Option<i64>, worker_concurrency: Option<i64>) -> HandOver {
    HandOver::new(
        &limits(concurrency, worker_concurrency),
        FLOW,
        60_000_000,
        VERSIONS,
    )
}

/// Claims up to `n` of the queue's instances for `lease`, under these
/// limits.
async fn claim_within(
    store: &Store,
    lease: keiro_store::Lease<'_>,
    limits: QueueLimits<'_>,
    n: i64,
) -> Vec<String> {
    let rows = store
        .claim_queue(lease, &[FLOW], VERSIONS, &limits, n)
        .await
        .unwrap();
    rows.into_iter().map(|row| row.id).collect()
}

/// A queue running over its `concurrency` (a finishing run's lease lapsed
/// and a claim filled its slot, or a deploy lowered the limit while the old
/// limit's instances ran): its ends free slots until it is back within the
/// limit, instead of handing each one over and keeping the queue over it.
async fn a_hand_over_starts_nothing_while_the_partition_runs_at_its_limit(db: &TestDb) {
    let store = &db.store;
    for id in ["a", "b", "c", "d", "e"] {
        Job::new(id, "p").enqueue(store).await;
    }
    // Three run: two under the limit of 2, one more by a worker that
    // declares 3.
    assert_eq!(
        claim_within(store, lease(), limits(Some(2), None), 2).await,
        ["a", "b"]
    );
    let other = keiro_store::Lease {
        owner: OTHER,
        ..lease()
    };
    assert_eq!(
        claim_within(store, other, limits(Some(3), None), 1).await,
        ["c"]
    );
    let within_two = hand_over_within(Some(2), None);
    let finish = |id: &'static str| {
        let within_two = within_two.clone();
        async move {
            let mut finished = store
                .finish_handing_over(&[completed(id, OWNER)], &[Some(&within_two)])
                .await
                .unwrap();
            let (applied, successor) = finished.remove(0);
            assert!(applied, "the finish of {id} applied");
            successor.map(|row| leased_to_owner(row).id)
        }
    };
    // a ends with b and c running: 2 of 2, no room.
    assert_eq!(finish("a").await, None);
    assert_eq!(status(store, "d").await, InstanceStatus::Pending);
    // b ends with c running: room for one.
    assert_eq!(finish("b").await, Some("d".to_owned()));
    assert_eq!(status(store, "e").await, InstanceStatus::Pending);
    // Another partition is not counted.
    Job::new("x", "other").enqueue(store).await;
    Job::new("y", "other").enqueue(store).await;
    assert_eq!(
        claim_within(store, lease(), limits(Some(2), None), 1).await,
        ["x"]
    );
    assert_eq!(finish("x").await, Some("y".to_owned()));
}

/// Likewise `worker_concurrency`, counted under the successor's owner: a
/// worker running over it (it claimed with a higher limit) frees slots.
async fn a_hand_over_starts_nothing_while_its_worker_runs_at_its_limit(db: &TestDb) {
    let store = &db.store;
    for id in ["a", "b", "c", "d"] {
        Job::new(id, "p").enqueue(store).await;
    }
    assert_eq!(
        claim_within(store, lease(), limits(None, Some(2)), 2).await,
        ["a", "b"]
    );
    let within_one = hand_over_within(None, Some(1));
    let mut finished = store
        .finish_handing_over(&[completed("a", OWNER)], &[Some(&within_one)])
        .await
        .unwrap();
    let (applied, successor) = finished.remove(0);
    assert!(applied);
    assert!(successor.is_none(), "b runs: 1 of 1");
    let mut finished = store
        .finish_handing_over(&[completed("b", OWNER)], &[Some(&within_one)])
        .await
        .unwrap();
    let (applied, successor) = finished.remove(0);
    assert!(applied);
    assert_eq!(
        successor.map(|row| leased_to_owner(row).id).as_deref(),
        Some("c")
    );
    // Another worker's instances do not count against this one's.
    let other = keiro_store::Lease {
        owner: OTHER,
        ..lease()
    };
    assert_eq!(
        claim_within(store, other, limits(None, Some(1)), 1).await,
        ["d"]
    );
    Job::new("e", "p").enqueue(store).await;
    let mut finished = store
        .finish_handing_over(&[completed("c", OWNER)], &[Some(&within_one)])
        .await
        .unwrap();
    let (_, successor) = finished.remove(0);
    assert_eq!(
        successor.map(|row| leased_to_owner(row).id).as_deref(),
        Some("e")
    );
}

/// The finishes of one commit hand over only as many slots as the
/// partition has room for once they all ended.
async fn finishes_of_one_commit_hand_over_only_into_room(db: &TestDb) {
    let store = &db.store;
    for id in ["a", "b", "c", "d", "e", "f"] {
        Job::new(id, "p").enqueue(store).await;
    }
    assert_eq!(
        claim_within(store, lease(), limits(Some(4), None), 4).await,
        ["a", "b", "c", "d"]
    );
    // Two of four end in one commit, under a limit lowered to 3: one
    // successor.
    let within_three = hand_over_within(Some(3), None);
    let finished = store
        .finish_handing_over(
            &[completed("a", OWNER), completed("b", OWNER)],
            &[Some(&within_three), Some(&within_three)],
        )
        .await
        .unwrap();
    let successors: Vec<String> = finished
        .into_iter()
        .filter_map(|(applied, successor)| {
            assert!(applied);
            successor.map(|row| leased_to_owner(row).id)
        })
        .collect();
    assert_eq!(successors, ["e"]);
    assert_eq!(status(store, "f").await, InstanceStatus::Pending);
}

fn completed<'a>(id: &'a str, owner: &'a str) -> Finish<'a> {
    Finish {
        id,
        generation: 0,
        owner,
        status: InstanceStatus::Completed,
        output: Some("1"),
        error: None,
    }
}

/// Finishes `id` as [`OWNER`], handing its slot over; the successor's id.
async fn finish_one(store: &Store, id: &str) -> Option<String> {
    let hand_over = hand_over();
    let mut finished = store
        .finish_handing_over(&[completed(id, OWNER)], &[Some(&hand_over)])
        .await
        .unwrap();
    let (applied, successor) = finished.remove(0);
    assert!(applied, "the finish of {id} applied");
    successor.map(|row| leased_to_owner(row).id)
}

/// Asserts `row` is running under [`OWNER`]'s live lease.
fn leased_to_owner(row: InstanceRow) -> InstanceRow {
    assert_eq!(row.status, InstanceStatus::Running, "{} runs", row.id);
    assert_eq!(
        row.lease_owner.as_deref(),
        Some(OWNER),
        "{} is ours",
        row.id
    );
    assert!(row.lease_expires_at.unwrap() > keiro_store::now_us());
    row
}

async fn status(store: &Store, id: &str) -> InstanceStatus {
    store.get_instance(id).await.unwrap().unwrap().status
}

async fn the_successor_is_the_next_of_the_partition_in_run_order(db: &TestDb) {
    let store = &db.store;
    Job::new("a", "p").enqueue(store).await;
    assert_eq!(claim(store, 1).await, ["a"]);
    // Taken by priority (lower first), then in creation order.
    Job {
        priority: 5,
        ..Job::new("late-low", "p")
    }
    .enqueue(store)
    .await;
    Job {
        priority: 1,
        ..Job::new("high", "p")
    }
    .enqueue(store)
    .await;
    Job {
        priority: 5,
        ..Job::new("later-low", "p")
    }
    .enqueue(store)
    .await;
    // Never a successor: another partition's (its limits are its own),
    // another workflow's, another signature's, another version's (all due
    // after the rows above), and one not due yet.
    Job::new("elsewhere", "other").enqueue(store).await;
    Job {
        name: "other-flow",
        priority: 9,
        ..Job::new("other-name", "p")
    }
    .enqueue(store)
    .await;
    Job {
        signature: Some("changed"),
        priority: 9,
        ..Job::new("other-signature", "p")
    }
    .enqueue(store)
    .await;
    Job {
        app_version: Some("v2"),
        priority: 9,
        ..Job::new("other-version", "p")
    }
    .enqueue(store)
    .await;
    Job {
        not_before: Some(keiro_store::now_us() + 3_600_000_000),
        ..Job::new("delayed", "p")
    }
    .enqueue(store)
    .await;

    assert_eq!(finish_one(store, "a").await.as_deref(), Some("high"));
    assert_eq!(finish_one(store, "high").await.as_deref(), Some("late-low"));
    assert_eq!(
        finish_one(store, "late-low").await.as_deref(),
        Some("later-low")
    );
    assert_eq!(finish_one(store, "later-low").await, None);
    for id in ["a", "high", "late-low", "later-low"] {
        assert_eq!(status(store, id).await, InstanceStatus::Completed, "{id}");
    }
    for id in [
        "elsewhere",
        "other-name",
        "other-signature",
        "other-version",
        "delayed",
    ] {
        assert_eq!(status(store, id).await, InstanceStatus::Pending, "{id}");
    }
}

async fn a_finish_that_does_not_apply_hands_nothing_over(db: &TestDb) {
    let store = &db.store;
    Job::new("a", "p").enqueue(store).await;
    assert_eq!(claim(store, 1).await, ["a"]);
    Job::new("b", "p").enqueue(store).await;
    let hand_over = hand_over();
    // Finished by an executor that does not hold its lease: refused, and
    // the slot stays a's.
    let finished = store
        .finish_handing_over(&[completed("a", "intruder")], &[Some(&hand_over)])
        .await
        .unwrap();
    assert!(matches!(finished.as_slice(), [(false, None)]));
    assert_eq!(status(store, "a").await, InstanceStatus::Running);
    assert_eq!(status(store, "b").await, InstanceStatus::Pending);
    // A finish without a hand-over frees the slot and takes nothing.
    let finished = store
        .finish_handing_over(&[completed("a", OWNER)], &[None])
        .await
        .unwrap();
    assert!(matches!(finished.as_slice(), [(true, None)]));
    assert_eq!(status(store, "b").await, InstanceStatus::Pending);
}

async fn an_instance_under_a_live_lease_is_never_a_successor(db: &TestDb) {
    let store = &db.store;
    Job::new("a", "p").enqueue(store).await;
    Job::new("b", "p").enqueue(store).await;
    Job::new("c", "p").enqueue(store).await;
    // a and b run: b (ours) is no successor of a's, though first in order.
    assert_eq!(claim(store, 2).await, ["a", "b"]);
    assert_eq!(finish_one(store, "a").await.as_deref(), Some("c"));
    assert_eq!(finish_one(store, "b").await, None);
}

async fn a_finish_under_a_lapsed_lease_is_not_its_own_successor(db: &TestDb) {
    let store = &db.store;
    Job::new("a", "p").enqueue(store).await;
    assert_eq!(claim(store, 1).await, ["a"]);
    Job::new("b", "p").enqueue(store).await;
    // a's lease lapsed while it ran (nobody took it), so the row it finishes
    // looks takeable, and it is first in run order.
    db.execute_raw(
        "UPDATE keiro_workflows SET lease_expires_at = 1, wake_at = 1 WHERE id = ?1",
        &["a"],
    )
    .await;
    assert_eq!(finish_one(store, "a").await.as_deref(), Some("b"));
    assert_eq!(status(store, "a").await, InstanceStatus::Completed);
}

async fn hand_overs_at_once_take_distinct_successors(db: &TestDb) {
    let store = &db.store;
    let ids: Vec<String> = (0..12).map(|n| format!("job-{n:02}")).collect();
    for id in &ids {
        Job::new(id, "p").enqueue(store).await;
    }
    let running = claim(store, 4).await;
    assert_eq!(running, ids[..4]);
    // Two finishes in one transaction, and two more from another store (a
    // second process) at the same moment.
    let other = db.second_store().await;
    let hand_over = hand_over();
    let both = [Some(&hand_over), Some(&hand_over)];
    let first = [completed(&running[0], OWNER), completed(&running[1], OWNER)];
    let second = [completed(&running[2], OWNER), completed(&running[3], OWNER)];
    let (one, two) = tokio::join!(
        store.finish_handing_over(&first, &both),
        other.finish_handing_over(&second, &both),
    );
    let mut successors: Vec<String> = one
        .unwrap()
        .into_iter()
        .chain(two.unwrap())
        .map(|(applied, successor)| {
            assert!(applied);
            leased_to_owner(successor.expect("a successor is waiting")).id
        })
        .collect();
    successors.sort();
    // The next four, each once.
    assert_eq!(successors, ids[4..8]);
    other.close().await;
    plan_settings_did_not_leak(store).await;
}

async fn lone_hand_overs_at_once_take_distinct_successors(db: &TestDb) {
    let store = &db.store;
    let ids: Vec<String> = (0..14).map(|n| format!("job-{n:02}")).collect();
    for id in &ids {
        Job::new(id, "p").enqueue(store).await;
    }
    let running = claim(store, 6).await;
    assert_eq!(running, ids[..6]);
    // Six finishes, each alone (on PostgreSQL one statement holds a lone
    // finish and its hand-over), three from each of two processes, at once.
    let other = db.second_store().await;
    let hand_over = hand_over();
    let finishes = running.iter().enumerate().map(|(n, id)| {
        let store = if n % 2 == 0 { store } else { &other };
        let hand_over = &hand_over;
        async move {
            store
                .finish_handing_over(&[completed(id, OWNER)], &[Some(hand_over)])
                .await
        }
    });
    let mut successors: Vec<String> = futures::future::join_all(finishes)
        .await
        .into_iter()
        .map(|finished| {
            let [(applied, successor)] = <[_; 1]>::try_from(finished.unwrap()).unwrap();
            assert!(applied);
            leased_to_owner(successor.expect("a successor is waiting")).id
        })
        .collect();
    successors.sort();
    // The next six, each once; the rest still wait.
    assert_eq!(successors, ids[6..12]);
    for id in &ids[12..] {
        assert_eq!(status(store, id).await, InstanceStatus::Pending, "{id}");
    }
    other.close().await;
}

async fn finishes_of_one_commit_hand_over_within_each_partition_in_run_order(db: &TestDb) {
    let store = &db.store;
    for id in ["a0", "a1", "a2", "a3", "a4", "a6"] {
        Job::new(id, "a").enqueue(store).await;
    }
    for id in ["b0", "b1"] {
        Job::new(id, "b").enqueue(store).await;
    }
    let limits = QueueLimits {
        name: QUEUE,
        concurrency: Some(3),
        worker_concurrency: None,
        rate_limit: None,
    };
    let rows = store
        .claim_queue(lease(), &[FLOW], VERSIONS, &limits, 10)
        .await
        .unwrap();
    let mut running: Vec<String> = rows.into_iter().map(|row| row.id).collect();
    running.sort();
    assert_eq!(running, ["a0", "a1", "a2", "b0", "b1"]);
    // Waiting now: a3, a4, a6 and a5 (which runs first), and b2.
    Job {
        priority: -1,
        ..Job::new("a5", "a")
    }
    .enqueue(store)
    .await;
    Job::new("b2", "b").enqueue(store).await;
    // Five finishes in one commit, the partitions interleaved.
    let order = ["a0", "b0", "a1", "b1", "a2"];
    let finishes: Vec<Finish<'_>> = order.iter().map(|id| completed(id, OWNER)).collect();
    let hand_over = hand_over();
    let hand_overs = vec![Some(&hand_over); order.len()];
    let finished = store
        .finish_handing_over(&finishes, &hand_overs)
        .await
        .unwrap();
    let mut of_a = Vec::new();
    let mut of_b = Vec::new();
    for (id, (applied, successor)) in order.iter().zip(finished) {
        assert!(applied, "the finish of {id} applied");
        let successor = successor.map(|row| leased_to_owner(row).id);
        match id.starts_with('a') {
            true => of_a.push(successor),
            false => of_b.push(successor),
        }
    }
    // Each partition's successors go to its own finishes, the first in run
    // order, each once; a finish its partition has no successor for gets
    // none.
    of_a.sort();
    of_b.sort();
    let some = |ids: &[&str]| -> Vec<Option<String>> {
        ids.iter().map(|id| Some(id.to_string())).collect()
    };
    assert_eq!(of_a, some(&["a3", "a4", "a5"]));
    assert_eq!(of_b, [None, Some("b2".into())]);
    assert_eq!(status(store, "a6").await, InstanceStatus::Pending);
    for id in order {
        assert_eq!(status(store, id).await, InstanceStatus::Completed, "{id}");
    }
    plan_settings_did_not_leak(store).await;
}

async fn a_queued_child_hands_over_and_reports_to_its_parent(db: &TestDb) {
    let store = &db.store;
    // Recorded off the queue.
    let parent = Job {
        name: "parent-flow",
        ..Job::new("parent", "")
    };
    store.create_instance(&parent.new_instance()).await.unwrap();
    let link = ParentLink {
        id: "parent",
        generation: 0,
        seq: 3,
    };
    let child = Job {
        parent: Some(link),
        ..Job::new("child", "p")
    };
    child.enqueue(store).await;
    Job::new("next", "p").enqueue(store).await;
    assert_eq!(claim(store, 1).await, ["child"]);
    assert_eq!(finish_one(store, "child").await.as_deref(), Some("next"));
    assert_eq!(status(store, "child").await, InstanceStatus::Completed);
    // The child's end is the step its parent awaits.
    let journal = store.load_journal("parent", 0).await.unwrap();
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!((journal[0].seq, journal[0].kind.as_str()), (3, "child"));
}

/// On PostgreSQL a batch transaction steers the plan cache with `SET LOCAL`:
/// every pooled connection is back on the server's default afterwards (a
/// session setting would follow the connection to unrelated statements).
async fn plan_settings_did_not_leak(store: &Store) {
    let Store::Postgres(pg) = store else { return };
    let pool = pg.pool();
    let mut held = Vec::new();
    for _ in 0..pool.size() {
        held.push(pool.acquire().await.unwrap());
    }
    for conn in &mut held {
        // A simple-protocol statement: one exchange, so it also works
        // through a transaction-pooling proxy.
        let row = sqlx::Executor::fetch_one(&mut **conn, "SHOW plan_cache_mode")
            .await
            .unwrap();
        let mode: String = sqlx::Row::get(&row, 0);
        assert_eq!(
            mode, "auto",
            "a pooled connection kept a batch's plan setting"
        );
    }
}

async fn an_instance_of_another_workflow_due_first_stops_the_hand_over(db: &TestDb) {
    let store = &db.store;
    for id in ["a", "b", "c"] {
        Job::new(id, "p").enqueue(store).await;
    }
    assert_eq!(claim(store, 3).await, ["a", "b", "c"]);
    // Ours waits at priority 5; another workflow's, at 0, runs first.
    Job {
        priority: 5,
        ..Job::new("mine", "p")
    }
    .enqueue(store)
    .await;
    Job {
        name: "other-flow",
        ..Job::new("urgent", "p")
    }
    .enqueue(store)
    .await;
    // A lone finish hands nothing over: its slot goes back for a claim,
    // which runs `urgent` first.
    assert_eq!(finish_one(store, "a").await, None);
    // Nor do the finishes of one commit.
    let hand_over = hand_over();
    let finished = store
        .finish_handing_over(
            &[completed("b", OWNER), completed("c", OWNER)],
            &[Some(&hand_over), Some(&hand_over)],
        )
        .await
        .unwrap();
    for (applied, successor) in finished {
        assert!(applied);
        assert!(successor.is_none(), "{successor:?}");
    }
    assert_eq!(status(store, "mine").await, InstanceStatus::Pending);
    assert_eq!(status(store, "urgent").await, InstanceStatus::Pending);
    plan_settings_did_not_leak(store).await;
}

/// An instance past its deadline is no successor and no claim takes it,
/// though it comes first in run order; nor does another workflow's one
/// stop a hand-over. The deadline sweep's read lists them, to end them as
/// timed out.
async fn an_instance_past_its_deadline_is_neither_a_successor_nor_claimed(db: &TestDb) {
    let store = &db.store;
    Job::new("a", "p").enqueue(store).await;
    assert_eq!(claim(store, 1).await, ["a"]);
    let past = Some(keiro_store::now_us() - 1_000_000);
    Job {
        deadline: past,
        ..Job::new("expired", "p")
    }
    .enqueue(store)
    .await;
    Job {
        name: "other-flow",
        deadline: past,
        ..Job::new("other-expired", "p")
    }
    .enqueue(store)
    .await;
    Job::new("next", "p").enqueue(store).await;
    assert_eq!(finish_one(store, "a").await.as_deref(), Some("next"));
    assert!(claim(store, 5).await.is_empty());
    for id in ["expired", "other-expired"] {
        assert_eq!(status(store, id).await, InstanceStatus::Pending);
    }
    let mut listed = store.queued_past_deadline(10).await.unwrap();
    listed.sort();
    assert_eq!(listed, ["expired", "other-expired"]);
}

/// Two finishes of one commit, behind whose first successor (ours) another
/// workflow's row comes next in run order: the second hands nothing over
/// (its slot goes back for a claim, which runs that row first), where
/// before only the partition's first takeable row was checked and the
/// second took our row behind the other workflow's.
async fn a_batch_hands_over_nothing_behind_another_workflows_row(db: &TestDb) {
    let store = &db.store;
    for id in ["a", "b"] {
        Job::new(id, "p").enqueue(store).await;
    }
    assert_eq!(claim(store, 2).await, ["a", "b"]);
    Job::new("mine-1", "p").enqueue(store).await;
    Job {
        name: "other-flow",
        ..Job::new("theirs", "p")
    }
    .enqueue(store)
    .await;
    Job::new("mine-2", "p").enqueue(store).await;
    let hand_over = hand_over();
    let finished = store
        .finish_handing_over(
            &[completed("a", OWNER), completed("b", OWNER)],
            &[Some(&hand_over), Some(&hand_over)],
        )
        .await
        .unwrap();
    let successors: Vec<Option<String>> = finished
        .into_iter()
        .map(|(applied, successor)| {
            assert!(applied);
            successor.map(|row| row.id)
        })
        .collect();
    assert_eq!(successors, [Some("mine-1".to_owned()), None]);
    assert_eq!(status(store, "theirs").await, InstanceStatus::Pending);
    assert_eq!(status(store, "mine-2").await, InstanceStatus::Pending);
}

/// A claim that waits for its queue (another transaction holds it:
/// SQLite's write lock, PostgreSQL's advisory lock on the queue) dates its
/// leases from when it goes on, not from when it was asked: they do not
/// lapse as it commits, where the next claim would count them free.
async fn a_claim_that_waited_for_its_queue_leases_from_when_it_goes_on(db: &TestDb) {
    use sqlx::Connection as _;
    Job::new("waited", "").enqueue(&db.store).await;
    let limits = QueueLimits {
        name: QUEUE,
        concurrency: Some(1),
        worker_concurrency: None,
        rate_limit: None,
    };
    let short = keiro_store::Lease {
        owner: OWNER,
        ttl_us: 500_000,
    };
    let held = std::time::Duration::from_millis(800);
    let claim = db.store.claim_queue(short, &[FLOW], VERSIONS, &limits, 1);
    let hold = async {
        match db.backend {
            support::Backend::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut c)
                    .await
                    .unwrap();
                tokio::time::sleep(held).await;
                sqlx::query("COMMIT").execute(&mut c).await.unwrap();
            }
            support::Backend::Postgres => {
                let mut tx = db.pg_pool().begin().await.unwrap();
                sqlx::query("SELECT pg_advisory_xact_lock(1801808241, hashtext($1))")
                    .bind(QUEUE)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tokio::time::sleep(held).await;
                tx.commit().await.unwrap();
            }
        }
    };
    // The hold begins first: the claim then waits for it.
    let (claimed, ()) = tokio::join!(
        async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            claim.await
        },
        hold
    );
    let after = db.store.now_us();
    let claimed = claimed.unwrap();
    assert_eq!(claimed.len(), 1);
    let expires = claimed[0].lease_expires_at.expect("a lease");
    assert!(
        expires > after,
        "the lease lapsed {} µs before the claim returned",
        after - expires
    );
}

/// A running instance of a named queue that is cancelled keeps its live
/// lease's expiry (not its owner), and the queue counts it as running until
/// its run lets go (`release_ended`): a claim meanwhile starts nothing in
/// its slot, one after it does. Renewing the lease fails, so the run finds
/// out.
async fn a_cancelled_run_holds_its_slot_until_it_lets_go(db: &TestDb) {
    Job::new("a", "").enqueue(&db.store).await;
    Job::new("b", "").enqueue(&db.store).await;
    assert_eq!(claim(&db.store, 1).await, vec!["a".to_owned()]);
    db.store.cancel("a").await.unwrap();
    let a = db.store.get_instance("a").await.unwrap().unwrap();
    assert_eq!(a.status, InstanceStatus::Cancelled);
    assert_eq!(a.lease_owner, None, "an ended instance has no holder");
    assert!(a.lease_expires_at.is_some(), "the lease's expiry is kept");
    assert!(!db.store.renew_lease("a", lease()).await.unwrap());
    assert!(
        claim(&db.store, 1).await.is_empty(),
        "a still holds the slot"
    );
    // Its worker counts it against `worker_concurrency` (of 1, with no
    // queue-wide limit).
    let per_worker = QueueLimits {
        name: QUEUE,
        concurrency: None,
        worker_concurrency: Some(1),
        rate_limit: None,
    };
    let mine = db
        .store
        .claim_queue(lease(), &[FLOW], VERSIONS, &per_worker, 1)
        .await
        .unwrap();
    assert!(mine.is_empty(), "a's worker is full: {mine:?}");
    assert!(
        !db.store.release_ended("a", OTHER).await.unwrap(),
        "a stale run of another executor does not free the hold"
    );
    assert!(
        !db.store.release_ended("b", OWNER).await.unwrap(),
        "b is pending"
    );
    assert!(db.store.release_ended("a", OWNER).await.unwrap());
    assert!(!db.store.release_ended("a", OWNER).await.unwrap(), "once");
    let a = db.store.get_instance("a").await.unwrap().unwrap();
    assert_eq!((a.lease_owner, a.lease_expires_at), (None, None));
    assert_eq!(a.status, InstanceStatus::Cancelled);
    assert_eq!(claim(&db.store, 1).await, vec!["b".to_owned()]);
    // Pending when cancelled: no lease to keep.
    Job::new("c", "").enqueue(&db.store).await;
    db.store.cancel("c").await.unwrap();
    let c = db.store.get_instance("c").await.unwrap().unwrap();
    assert_eq!((c.lease_owner, c.lease_expires_at), (None, None));
}

/// A retry of an instance whose cancelled run has not let go yet keeps that
/// run's hold: the instance is pending but neither it nor another of its
/// queue starts until the run lets go (its old run and its new one would
/// run side by side, one over the queue's limit), and it is due at once
/// when the run does. Cancelled again meanwhile, it still holds the slot.
async fn a_retried_instance_waits_for_its_cancelled_run_to_let_go(db: &TestDb) {
    Job::new("a", "").enqueue(&db.store).await;
    Job::new("b", "").enqueue(&db.store).await;
    assert_eq!(claim(&db.store, 1).await, vec!["a".to_owned()]);
    db.store.cancel("a").await.unwrap();
    assert_eq!(db.store.retry("a").await.unwrap(), Retry::Retried);
    let a = db.store.get_instance("a").await.unwrap().unwrap();
    assert_eq!(a.status, InstanceStatus::Pending);
    assert_eq!(a.lease_owner, None);
    assert!(a.lease_expires_at.is_some(), "the run's hold is kept");
    // The old run's end applies to it no more, alone or beside another's.
    let old_end = [completed("a", OWNER), completed("none", OWNER)];
    assert_eq!(
        db.store.finish_many(&old_end[..1]).await.unwrap(),
        vec![false]
    );
    assert_eq!(
        db.store.finish_many(&old_end).await.unwrap(),
        vec![false, false]
    );
    assert!(
        claim(&db.store, 1).await.is_empty(),
        "the cancelled run still holds the slot"
    );
    // Cancelled again before the run stopped: still held.
    db.store.cancel("a").await.unwrap();
    assert!(claim(&db.store, 1).await.is_empty(), "still held");
    assert_eq!(db.store.retry("a").await.unwrap(), Retry::Retried);
    assert!(claim(&db.store, 1).await.is_empty(), "still held");
    // With room for one more, the next in run order starts, not `a`.
    assert_eq!(claim(&db.store, 2).await, vec!["b".to_owned()]);
    assert!(db.store.release_ended("a", OWNER).await.unwrap());
    let a = db.store.get_instance("a").await.unwrap().unwrap();
    assert_eq!((a.lease_owner, a.lease_expires_at), (None, None));
    assert_eq!(a.status, InstanceStatus::Pending);
    assert_eq!(
        claim(&db.store, 3).await,
        vec!["a".to_owned()],
        "due now that the old run let go"
    );
    // Its new run holds a lease of its own, which a late release of the
    // old run leaves alone.
    assert!(!db.store.release_ended("a", OWNER).await.unwrap());
    assert!(db.store.renew_lease("a", lease()).await.unwrap());
}

conformance!(
    an_instance_past_its_deadline_is_neither_a_successor_nor_claimed,
    a_hand_over_starts_nothing_while_the_partition_runs_at_its_limit,
    a_hand_over_starts_nothing_while_its_worker_runs_at_its_limit,
    finishes_of_one_commit_hand_over_only_into_room,
    a_retried_instance_waits_for_its_cancelled_run_to_let_go,
    a_cancelled_run_holds_its_slot_until_it_lets_go,
    a_claim_that_waited_for_its_queue_leases_from_when_it_goes_on,
    an_instance_of_another_workflow_due_first_stops_the_hand_over,
    a_batch_hands_over_nothing_behind_another_workflows_row,
    the_successor_is_the_next_of_the_partition_in_run_order,
    a_finish_that_does_not_apply_hands_nothing_over,
    an_instance_under_a_live_lease_is_never_a_successor,
    a_finish_under_a_lapsed_lease_is_not_its_own_successor,
    hand_overs_at_once_take_distinct_successors,
    lone_hand_overs_at_once_take_distinct_successors,
    finishes_of_one_commit_hand_over_within_each_partition_in_run_order,
    a_queued_child_hands_over_and_reports_to_its_parent,
);

/// PostgreSQL: a hand-over that skips a row another hand-over is leasing
/// (locked, still takeable in its snapshot) does not take our row behind
/// another workflow's instead: it hands nothing over, and a claim runs the
/// other workflow's row first. (Before, the check read the partition's
/// first takeable row, the locked one, which is ours, and let it by.)
#[tokio::test]
async fn postgres_a_hand_over_past_a_locked_row_passes_no_other_workflow() {
    let db = TestDb::postgres().await;
    let store = &db.store;
    Job::new("a", "p").enqueue(store).await;
    assert_eq!(claim(store, 1).await, ["a"]);
    Job::new("leasing", "p").enqueue(store).await;
    Job {
        name: "other-flow",
        ..Job::new("theirs", "p")
    }
    .enqueue(store)
    .await;
    Job::new("behind", "p").enqueue(store).await;
    // Another hand-over holds the first row, mid-lease.
    let mut other = db.pg_pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM keiro.workflows WHERE id = 'leasing' FOR UPDATE")
        .execute(&mut *other)
        .await
        .unwrap();
    assert_eq!(finish_one(store, "a").await, None);
    other.rollback().await.unwrap();
    assert_eq!(status(store, "theirs").await, InstanceStatus::Pending);
    assert_eq!(status(store, "behind").await, InstanceStatus::Pending);
    db.finish().await;
}
