//! A worker cut off from PostgreSQL for longer than its lease. Worker A (its
//! own process) reaches a throwaway cluster through a TCP proxy; mid-run the
//! proxy partitions it for longer than A's lease; worker B (another process,
//! direct connection) takes over; then the proxy forwards again.
//!
//! Two partitions: a blackhole (open connections carry nothing, so A's
//! requests hang, and new ones are refused) that lasts until B finished every
//! workflow, releasing A's held writes only then; and a cut (connections
//! closed and refused, so A's requests fail at once) healed while B is still
//! running a step whose body A began before the cut, just before A's returns.
//!
//! A must not journal over B: journal rows present when the partition heals
//! never change, every row added after it is B's, every A row comes from a
//! step A began before the partition, within a workflow no A result follows
//! a B result, each workflow completed once with its journal's results, and no
//! step body (A's after the partition included) started after its result was
//! journaled.
//!
//! Three more partitions at precise points: one blackholes a queue claim
//! inside its transaction (other workers' claims must not wait on it), one
//! a start holding the migration's schema lock (other starts must not wait
//! on it), one breaks a cancel's connection while its COMMIT runs (the
//! retry must know the cancel as its own).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use keiro::Keiro;
use keiro_tests::faults::{
    assert_no_journaled_step_ran_again, checked_steps, journal_results, step_entries,
    wait_all_completed, FaultWorker,
};
use keiro_tests::pg_cluster::{cluster_or_skip, PgCluster};
use keiro_tests::tcp_proxy::TcpProxy;
use keiro_tests::workflows::append_line;

const WORKER: &str = env!("CARGO_BIN_EXE_fault_worker");
const MARKER: &str = "PARTITION";

/// A's and B's database, the proxy in front of it for A, and the log.
struct Scene {
    _cluster: PgCluster,
    url: String,
    proxy: TcpProxy,
    keiro: Keiro,
    _dir: tempfile::TempDir,
    log: PathBuf,
    run: String,
    ids: Vec<String>,
}

impl Scene {
    /// A fresh cluster, a proxy to it, and `workflows` instances of
    /// `checked_steps(steps, pause_ms)` enqueued (nothing runs them yet).
    async fn new(test: &str, workflows: usize, steps: u32, pause_ms: u64) -> Option<Scene> {
        let cluster = cluster_or_skip(test)?;
        let url = cluster.keiro_url();
        let proxy = TcpProxy::start(([127, 0, 0, 1], cluster.port()).into()).await;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("steps.log");
        let run = uuid::Uuid::new_v4().simple().to_string();
        let keiro = Keiro::builder(&url)
            .executor_id(format!("partition-test-{run}"))
            .connect()
            .await
            .unwrap();
        let ids: Vec<String> = (0..workflows).map(|w| format!("wf-{w}")).collect();
        for id in &ids {
            checked_steps(
                id.clone(),
                steps,
                log.to_str().unwrap().to_owned(),
                pause_ms,
            )
            .id(id.clone())
            .on(&keiro)
            .enqueue()
            .await
            .unwrap();
        }
        Some(Scene {
            _cluster: cluster,
            url,
            proxy,
            keiro,
            _dir: dir,
            log,
            run,
            ids,
        })
    }

    /// Worker A, through the proxy.
    async fn start_a(&self, lease: Duration) -> FaultWorker {
        let proxied = format!("postgres://postgres@{}/keiro_fault", self.proxy.addr());
        FaultWorker::start(
            WORKER,
            &proxied,
            &format!("partition-a-{}", self.run),
            Some(lease),
        )
        .await
    }

    /// Worker B, direct.
    async fn start_b(&self, lease: Duration) -> FaultWorker {
        FaultWorker::start(
            WORKER,
            &self.url,
            &format!("partition-b-{}", self.run),
            Some(lease),
        )
        .await
    }

    /// Waits (30 s at most) until every workflow's step `n` began.
    async fn wait_all_began(&self, n: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while step_entries(&self.log).iter().filter(|e| e.n == n).count() < self.ids.len() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "A never reached step {n} of every workflow"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Marks the partition's start in the log (A's bodies logged before it
    /// began before the partition).
    fn mark_partition(&self) {
        append_line(self.log.to_str().unwrap(), MARKER);
    }

    /// Every assertion of the module docs; `before_heal` is the journal as
    /// read just before the proxy forwarded again. Returns how many workflows
    /// B took over.
    async fn assert_a_did_not_journal_over_b(
        &self,
        steps: u32,
        before_heal: &[(String, i64, String)],
        a_pid: &str,
        b_pid: &str,
    ) -> usize {
        let lines = keiro_tests::process::lines_of(&self.log);
        let partition_line = lines.iter().position(|l| l == MARKER).unwrap();
        let entries = step_entries(&self.log);
        let a_began_before: HashSet<(String, u32)> = entries
            .iter()
            .filter(|e| e.pid == a_pid && e.line < partition_line)
            .map(|e| (e.id.clone(), e.n))
            .collect();
        let results = journal_results(&self.keiro).await.unwrap();
        assert_eq!(
            results.len(),
            self.ids.len() * steps as usize,
            "one journal row per step"
        );
        let earlier: HashMap<(&str, i64), &str> = before_heal
            .iter()
            .map(|(id, seq, result)| ((id.as_str(), *seq), result.as_str()))
            .collect();
        for (id, seq, result) in &results {
            match earlier.get(&(id.as_str(), *seq)) {
                Some(was) => assert_eq!(
                    was, result,
                    "workflow {id} seq {seq}: a journaled step changed after the partition healed"
                ),
                None => assert_eq!(
                    serde_json::from_str::<String>(result).unwrap(),
                    b_pid,
                    "workflow {id} seq {seq}: journaled after the partition healed by a process \
                     other than B ({b_pid}); A ({a_pid}) had lost its lease: A journaled over B"
                ),
            }
        }
        let mut per_workflow: HashMap<String, Vec<String>> = HashMap::new();
        for (id, _, result) in &results {
            per_workflow
                .entry(id.clone())
                .or_default()
                .push(serde_json::from_str(result).unwrap());
        }
        let mut taken_over = 0;
        for id in &self.ids {
            let journaled = &per_workflow[id];
            for (i, pid) in journaled.iter().enumerate() {
                let n = i as u32 + 1;
                assert!(
                    *pid == b_pid || (*pid == a_pid && a_began_before.contains(&(id.clone(), n))),
                    "workflow {id} step {n}: journaled result from process {pid} (A = {a_pid}, \
                     B = {b_pid}) that A began only after the partition; journal {journaled:?}"
                );
            }
            if let Some(first_b) = journaled.iter().position(|pid| *pid == b_pid) {
                taken_over += 1;
                assert!(
                    journaled[first_b..].iter().all(|pid| *pid == b_pid),
                    "workflow {id}: an A result after B took over: {journaled:?}"
                );
            }
            let out: Vec<String> = self.keiro.handle(id).await.unwrap().result().await.unwrap();
            assert_eq!(
                &out, journaled,
                "workflow {id}: output differs from its journal"
            );
        }
        assert!(taken_over > 0, "B took over no workflow");
        let reruns = assert_no_journaled_step_ran_again(&self.log, &self.ids, steps);
        let a_after = entries
            .iter()
            .filter(|e| e.pid == a_pid && e.line > partition_line)
            .count();
        eprintln!(
            "workflows B took over: {taken_over}; step bodies run more than once: {reruns}; \
             bodies A began after the partition: {a_after}"
        );
        taken_over
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_blackholed_past_its_lease_does_not_journal_over_its_successor() {
    const STEPS: u32 = 5;
    const LEASE: Duration = Duration::from_secs(3);
    let Some(scene) = Scene::new(
        "a_worker_blackholed_past_its_lease_does_not_journal_over_its_successor",
        16,
        STEPS,
        300,
    )
    .await
    else {
        return;
    };
    let a = scene.start_a(LEASE).await;
    // Partition once A is inside every workflow (its second step began).
    scene.wait_all_began(2).await;
    scene.mark_partition();
    scene.proxy.blackhole();

    let b = scene.start_b(LEASE).await;
    wait_all_completed(&scene.keiro, scene.ids.len(), Duration::from_secs(60)).await;
    // Heal: A's held requests reach the database now. Give them time to land
    // (a lease's worth of renewal periods).
    let before_heal = journal_results(&scene.keiro).await.unwrap();
    scene.proxy.resume();
    tokio::time::sleep(LEASE).await;

    scene
        .assert_a_did_not_journal_over_b(STEPS, &before_heal, &a.pid(), &b.pid())
        .await;
    a.kill().await;
    b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_past_its_lease_stops_instead_of_journaling_late() {
    // One step of 9.5 s, a 4 s lease. A begins it (at E) and the cut follows
    // at once: A's lease renewals fail from then on, its lease lapses by
    // E + 4 s, and B claims the instance and runs the step itself (until
    // E + 12 s at the earliest). The cut heals at E + 9.35 s, just before A's
    // body returns (E + 9.5 s): a worker still running past its lease would
    // journal the step then, ahead of B, and B would adopt A's result. A
    // worker that cannot renew its lease must stop the run before it may
    // lapse.
    const STEPS: u32 = 1;
    const PAUSE_MS: u64 = 9_500;
    const LEASE: Duration = Duration::from_secs(4);
    const HEAL_AFTER: Duration = Duration::from_millis(PAUSE_MS - 150);
    let Some(scene) = Scene::new(
        "a_worker_cut_off_past_its_lease_stops_instead_of_journaling_late",
        4,
        STEPS,
        PAUSE_MS,
    )
    .await
    else {
        return;
    };
    let a = scene.start_a(LEASE).await;
    scene.wait_all_began(1).await;
    let began = tokio::time::Instant::now();
    scene.mark_partition();
    scene.proxy.cut();

    let b = scene.start_b(LEASE).await;
    tokio::time::sleep_until(began + HEAL_AFTER).await;
    let before_heal = journal_results(&scene.keiro).await.unwrap();
    scene.proxy.resume();
    wait_all_completed(&scene.keiro, scene.ids.len(), Duration::from_secs(60)).await;

    let taken_over = scene
        .assert_a_did_not_journal_over_b(STEPS, &before_heal, &a.pid(), &b.pid())
        .await;
    assert_eq!(taken_over, scene.ids.len(), "B took over every workflow");
    a.kill().await;
    b.kill().await;
}

/// Worker A's claim of queue `q` took the queue's lock (a transaction lock
/// every claim of the queue takes first) just as a blackhole cut it off: its
/// transaction stays open on the server, lock held, with nobody left to end
/// it. Worker B's claim of the queue must still get through once A's
/// transaction has sat idle past keiro's bound, not wait on it for as long
/// as the server keeps the dead connection (hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_claim_blackholed_inside_its_transaction_holds_no_other_claim_back() {
    use keiro_store::{Lease, NewInstance, Queued, Registered, Store, StoreOptions};
    use sqlx::Connection;

    const QUEUE: &str = "q";
    const FLOW: Registered<'static> = Registered {
        name: "flow",
        signature: "sig",
    };
    /// The lock every claim of queue `q` takes first (keiro's key for it).
    const QUEUE_LOCK: &str = "pg_advisory_lock(1801808241, hashtext('q'))";
    /// How long B may wait (keiro bounds A's idle transaction to 5 s)
    /// before the test calls it stuck.
    const PATIENCE: Duration = Duration::from_secs(30);

    let Some(cluster) = cluster_or_skip(
        "a_queue_claim_blackholed_inside_its_transaction_holds_no_other_claim_back",
    ) else {
        return;
    };
    let url = cluster.keiro_url();
    let proxy = TcpProxy::start(([127, 0, 0, 1], cluster.port()).into()).await;
    let proxied = format!("postgres://postgres@{}/keiro_fault", proxy.addr());
    let b = Store::connect(&url, &StoreOptions::default())
        .await
        .unwrap();
    let a = Store::connect(&proxied, &StoreOptions::default())
        .await
        .unwrap();
    let new = NewInstance {
        signature: Some(FLOW.signature),
        ..NewInstance::new("job", FLOW.name, "[]")
    };
    let queued = Queued {
        queue: Some(QUEUE),
        priority: 0,
        partition: "",
        dedup: None,
        not_before: None,
    };
    assert!(b.create_queued(&new, &queued).await.unwrap().1);
    let lease = |owner| Lease {
        owner,
        ttl_us: 60_000_000,
    };

    // The test holds the queue's lock, so A's claim stops on it, its
    // transaction begun; the blackhole falls; then the test lets go, and A's
    // claim takes the lock on the server, its answer held by the proxy.
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(&format!("SELECT {QUEUE_LOCK}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let a_claim = tokio::spawn({
        let a = a.clone();
        async move {
            a.claim_queue(lease("a"), &[FLOW], &[], &limits_of(QUEUE), 1)
                .await
        }
    });
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND wait_event = 'advisory' AND pid <> pg_backend_pid()";
    wait_for_rows(
        &mut admin,
        waiting,
        Duration::from_secs(30),
        "A's claim never waited on the queue's lock",
    )
    .await;
    proxy.blackhole();
    sqlx::query(&format!(
        "SELECT {}",
        QUEUE_LOCK.replace("lock(", "unlock(")
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let holding = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'";
    wait_for_rows(
        &mut admin,
        holding,
        Duration::from_secs(5),
        "A's claim never held the queue's lock idle",
    )
    .await;

    let began = tokio::time::Instant::now();
    let claimed = tokio::time::timeout(
        PATIENCE,
        b.claim_queue(lease("b"), &[FLOW], &[], &limits_of(QUEUE), 1),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "B's claim of queue `{QUEUE}` still waited after {PATIENCE:?} on the lock of A's \
             abandoned claim"
        )
    })
    .unwrap();
    eprintln!("B's claim went through after {:?}", began.elapsed());
    let ids: Vec<&str> = claimed.iter().map(|row| row.id.as_str()).collect();
    assert_eq!(ids, ["job"], "B claims the queued instance");

    // Healed, A learns its transaction is gone and claims nothing.
    proxy.resume();
    let a_result = tokio::time::timeout(PATIENCE, a_claim)
        .await
        .expect("A's claim returns once the partition healed")
        .unwrap();
    assert!(
        a_result.as_ref().map_or(true, Vec::is_empty),
        "A claimed {a_result:?} after its transaction was ended"
    );
    let row = b.get_instance("job").await.unwrap().unwrap();
    assert_eq!(row.lease_owner.as_deref(), Some("b"), "the instance is B's");
}

/// Queue `name` with a concurrency of one.
fn limits_of(name: &str) -> keiro_store::QueueLimits<'_> {
    keiro_store::QueueLimits {
        name,
        concurrency: Some(1),
        worker_concurrency: None,
        rate_limit: None,
    }
}

/// A cancel whose COMMIT took effect but whose answer was lost (the
/// connection broke while the COMMIT ran): keiro tries again, finds the
/// instance cancelled, and reports the cancel as its own (`Cancelled`
/// naming the instance), not as one somebody else made earlier
/// (`AlreadyFinished`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_commit_answer_is_lost_reports_its_own_cancel() {
    use sqlx::Connection;

    let Some(scene) = Scene::new(
        "a_cancel_whose_commit_answer_is_lost_reports_its_own_cancel",
        1,
        1,
        0,
    )
    .await
    else {
        return;
    };
    let id = scene.ids[0].clone();
    let mut admin = sqlx::PgConnection::connect(&scene.url).await.unwrap();
    // The cancel's COMMIT waits on a lock the test holds: a deferred
    // trigger takes it as the instance's cancelled row commits.
    sqlx::raw_sql(
        "CREATE FUNCTION keiro.hold_commit() RETURNS trigger AS $$ BEGIN \
         IF NEW.status = 'cancelled' THEN PERFORM pg_advisory_xact_lock(4242); END IF; \
         RETURN NULL; END $$ LANGUAGE plpgsql; \
         CREATE CONSTRAINT TRIGGER hold_commit AFTER UPDATE ON keiro.workflows \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION keiro.hold_commit(); \
         SELECT pg_advisory_lock(4242)",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let proxied = format!("postgres://postgres@{}/keiro_fault", scene.proxy.addr());
    let a = Keiro::builder(&proxied)
        .executor_id(format!("cancel-a-{}", scene.run))
        .connect()
        .await
        .unwrap();
    let cancel = tokio::spawn({
        let (a, id) = (a.clone(), id.clone());
        async move { a.cancel(&id).await }
    });
    let committing = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' \
                      AND query = 'COMMIT'";
    wait_for_rows(
        &mut admin,
        committing,
        Duration::from_secs(30),
        "the cancel's COMMIT never waited on the test's lock",
    )
    .await;
    // The connection breaks before the answer; then the COMMIT completes.
    scene.proxy.cut();
    sqlx::query("SELECT pg_advisory_unlock(4242)")
        .execute(&mut admin)
        .await
        .unwrap();
    let cancelled =
        format!("SELECT count(*) FROM keiro.workflows WHERE id = '{id}' AND status = 'cancelled'");
    wait_for_rows(
        &mut admin,
        &cancelled,
        Duration::from_secs(30),
        "the cancel never committed",
    )
    .await;
    assert!(!cancel.is_finished(), "the cancel returned before a retry");
    scene.proxy.resume();
    let outcome = tokio::time::timeout(Duration::from_secs(60), cancel)
        .await
        .expect("the cancel returns once the database answers again")
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        keiro::CancelOutcome::Cancelled {
            ids: vec![id.clone()]
        },
        "the cancel that committed unseen is this call's own"
    );
}

/// Polls `count` (a `SELECT count(*)`) on `admin` until it counts a row,
/// panicking with `never` after `limit`.
async fn wait_for_rows(admin: &mut sqlx::PgConnection, count: &str, limit: Duration, never: &str) {
    let deadline = tokio::time::Instant::now() + limit;
    while sqlx::query_scalar::<_, i64>(count)
        .fetch_one(&mut *admin)
        .await
        .unwrap()
        == 0
    {
        assert!(tokio::time::Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Worker A's start took the schema lock (a session lock every starting
/// process takes to migrate) just as a blackhole cut it off: its session
/// stays on the server, lock held, with nobody left to end it. Worker B's
/// start must still get through once A's session has sat idle past keiro's
/// bound, not wait for as long as the server keeps the dead connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_blackholed_holding_the_schema_lock_holds_no_other_start_back() {
    use keiro_store::{Store, StoreOptions};
    use sqlx::Connection;

    /// keiro's schema lock (`"keiro"` in ASCII).
    const SCHEMA_LOCK: i64 = 0x6b_6569_726f;
    const PATIENCE: Duration = Duration::from_secs(30);

    let Some(cluster) =
        cluster_or_skip("a_start_blackholed_holding_the_schema_lock_holds_no_other_start_back")
    else {
        return;
    };
    let url = cluster.keiro_url();
    let proxy = TcpProxy::start(([127, 0, 0, 1], cluster.port()).into()).await;
    let proxied = format!("postgres://postgres@{}/keiro_fault", proxy.addr());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut admin)
        .await
        .unwrap();
    let a_start =
        tokio::spawn(async move { Store::connect(&proxied, &StoreOptions::default()).await });
    wait_for_rows(
        &mut admin,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'",
        PATIENCE,
        "A's start never waited on the schema lock",
    )
    .await;
    proxy.blackhole();
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut admin)
        .await
        .unwrap();
    wait_for_rows(
        &mut admin,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND pid <> pg_backend_pid()",
        Duration::from_secs(5),
        "A's start never took the schema lock",
    )
    .await;

    let began = tokio::time::Instant::now();
    let b = tokio::time::timeout(PATIENCE, Store::connect(&url, &StoreOptions::default()))
        .await
        .unwrap_or_else(|_| {
            panic!("B's start still waited after {PATIENCE:?} on the lock of A's vanished start")
        })
        .unwrap();
    eprintln!("B started after {:?}", began.elapsed());
    assert!(
        b.get_instance("none").await.unwrap().is_none(),
        "B's store works"
    );
    proxy.resume();
    // A's start ends either way (its session is gone: an error, or a
    // retry on a new one).
    let _ = tokio::time::timeout(PATIENCE, a_start)
        .await
        .expect("A's start returns once the partition healed")
        .unwrap();
}
