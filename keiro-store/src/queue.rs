//! Queues (`keiro::queue!`): recording an instance on a named queue, and the
//! claim that starts a queue's due instances within its limits.
//!
//! A queue's limits hold per partition key (`''` when none was given):
//! `concurrency` counts the queue's instances running under a live lease in
//! any process (one cancelled or timed out while it ran counts until its run
//! has stopped, even once retried: see `Store::release_ended`),
//! `worker_concurrency` those under the claiming executor's lease (and those
//! of its runs still holding a slot so), and
//! the rate limit counts first starts (`queue_started_at`) in the sliding
//! window `(now - period, now]`. A suspended instance holds no slot:
//! it gave up its lease, and when it is due again only the concurrency limits
//! hold it back (it is no second start, and the rate limit does not apply);
//! on a queue with a rate limit the claim takes such instances first, then
//! new starts in the slots left.
//!
//! A claim reads each partition that has a takeable row with its three counts
//! (skipping through the queue's order index one partition key at a time),
//! serves the partitions in the order of their first takeable row (the one
//! waiting longest goes first), and takes from each as many rows, in run
//! order, as its room allows: its cost grows with the number of partitions,
//! not with the number of due rows waiting behind the ones it takes. Rows
//! ahead of those in run order that are not due yet (suspended until later,
//! or delayed: they keep their place in line) are read past, one index
//! entry each.
//!
//! Race freedom: on PostgreSQL each queue's claim runs in a transaction that
//! first takes a transaction-scoped advisory lock on the queue's name, so
//! claims of one queue from any number of processes run one after the other,
//! and each counts what the previous ones committed (under `READ COMMITTED`
//! every statement reads a fresh snapshot). Claims of other queues and of
//! the default queue never wait on it. On SQLite the claim runs under
//! `BEGIN IMMEDIATE`, which already serialises writers.

use crate::query::Session;
use crate::rows::{Claimed, FromRow, StoreRow};
use crate::sql::Dialect;
use crate::{Conn, InstanceRow, Lease, Registered, Result, Store, StoreError};

/// Ends a correlated `EXISTS` read of rows ahead in a partition's run
/// order: one row answers it; the order makes PostgreSQL read it off the
/// queue's order index, where its bounds on `priority` and `created_at`
/// are index conditions (without it, planned on a young table's
/// statistics, it read another index and filtered every unfinished row of
/// the partition, per candidate); and the `OFFSET` keeps it from being
/// turned into an anti-join over the whole partition.
const FIRST_ONLY: &str = " ORDER BY o.priority, o.created_at, o.id LIMIT 1 OFFSET 0";

/// How a new instance sits on its queue.
#[derive(Debug, Clone, Copy)]
pub struct Queued<'a> {
    /// The queue's name; `None`: the default queue (only `not_before`
    /// applies there).
    pub queue: Option<&'a str>,
    /// Lower runs first within the queue; equal priorities in creation order.
    pub priority: i64,
    /// The key the queue's limits apply per (`""`: the queue's one shared
    /// partition).
    pub partition: &'a str,
    /// While an unfinished instance of this queue has this key, another is
    /// refused with [`StoreError::Duplicate`].
    pub dedup: Option<&'a str>,
    /// Not claimed before this time (µs since the Unix epoch, store clock).
    pub not_before: Option<i64>,
}

/// What a finishing instance of a queue needs to hand its slot over to the
/// next instance of its partition in the transaction that records its end
/// ([`Store::finish_handing_over`]), instead of freeing the slot and leaving
/// the next to a claim of its own.
///
/// The successor is the partition's first takeable instance in run order
/// that is not under a live lease, of workflow `name` (with the registered
/// `signature`, or none recorded) and of an accepted version. Handing over
/// keeps the queue's counts as they were: one instance leaves the running
/// set as another, under the same lease owner, enters it, in one commit;
/// so no claim's count of the queue can see more running than before, and
/// it needs no queue lock. It still counts the partition's running
/// instances, and starts a successor only into room the queue's
/// `concurrency` and `worker_concurrency` leave: where the queue runs more
/// than its limits (the finishing run's lease lapsed and a claim filled its
/// slot, a deploy lowered a limit, a clock was off), ends free slots until
/// it is back within them, instead of keeping it over. A start counts
/// against a rate limit, which a hand-over does not check: a queue with one
/// is never handed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOver {
    /// The queue the finishing instance was claimed from.
    pub queue: String,
    /// The workflow the successor runs (the one this worker has running).
    pub name: String,
    /// That workflow's registered signature.
    pub signature: String,
    /// The lease the successor is claimed under, its TTL in µs.
    pub ttl_us: i64,
    /// The claimable application versions, as a JSON array.
    pub versions: String,
    /// The queue's `concurrency` as this worker declares it: the hand-over
    /// starts a successor only while the partition runs fewer (see below).
    pub concurrency: Option<i64>,
    /// Likewise its `worker_concurrency`, counted under the successor's
    /// lease owner.
    pub worker_concurrency: Option<i64>,
}

impl HandOver {
    /// A hand-over on the queue `limits` name, within its concurrency
    /// limits, of workflow `workflow`, claiming under a lease of `ttl_us`
    /// µs, of one of `versions` (or unversioned).
    pub fn new(
        limits: &QueueLimits<'_>,
        workflow: Registered<'_>,
        ttl_us: i64,
        versions: &[&str],
    ) -> HandOver {
        HandOver {
            queue: limits.name.to_owned(),
            name: workflow.name.to_owned(),
            signature: workflow.signature.to_owned(),
            ttl_us,
            versions: crate::versions::versions_json(versions),
            concurrency: limits.concurrency,
            worker_concurrency: limits.worker_concurrency,
        }
    }
}

/// A queue's limits as a claim applies them, each per partition key.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits<'a> {
    /// The queue's name.
    pub name: &'a str,
    /// At most this many of its instances running at once in all processes.
    pub concurrency: Option<i64>,
    /// At most this many running at once under one executor's lease.
    pub worker_concurrency: Option<i64>,
    /// At most `.0` first starts within any `.1` µs (a sliding window).
    pub rate_limit: Option<(i64, i64)>,
}

/// One backend's text of the queue statements.
#[derive(Debug)]
pub(crate) struct QueueStatements {
    /// Serialises one queue's claims across processes (PostgreSQL).
    lock: Option<&'static str>,
    /// The server's clock (see `Dialect::server_now_us`).
    server_now_us: Option<&'static str>,
    /// The queued instances past their deadline that no live run holds
    /// (see [`Store::queued_past_deadline`]).
    pub(crate) past_deadline: String,
    mark_queued: String,
    find_duplicate: String,
    /// Another unfinished instance holding the queue and dedup key of
    /// instance `$1`.
    dedup_holder: String,
    pub(crate) rooms: String,
    pub(crate) claim_partition: String,
    /// As `claim_partition`, of instances that started before only.
    pub(crate) claim_started: String,
    /// As `claim_partition`, of instances never started only.
    pub(crate) claim_fresh: String,
    pub(crate) hand_over: String,
    /// Several slots of one partition handed over at once (see
    /// [`hand_over_all_on`]).
    pub(crate) hand_over_partition: String,
    /// A lone finish of an instance without a parent and its hand-over in
    /// one autocommitted statement (where `WITH` may hold `UPDATE`s).
    pub(crate) finish_handing_over: Option<String>,
}

impl QueueStatements {
    /// Spells the queue statements in `d`'s dialect.
    /// `finish` is the shared finish statement (see `Statements::finish`).
    pub(crate) fn new(d: &Dialect, finish: &str) -> QueueStatements {
        let w = format!("{}workflows", d.tables);
        let unfinished = "status IN ('pending', 'running', 'suspended')";
        // The indexes the reads below name on SQLite (see
        // `Dialect::indexed_by`): the queue's run order, its unfinished rows,
        // its running rows, its first starts.
        let (order_index, unfinished_index, running_index, started_index) = (
            d.index(&w, "queue_order"),
            d.index(&w, "queue_unfinished"),
            d.index(&w, "queue_running"),
            d.index(&w, "queue_started"),
        );
        // Counts rows of queue `queue` in partition `partition` meeting
        // `cond`, read off `index`.
        let count_in = |index: &str, queue: &str, partition: &str, cond: &str| {
            format!(
                "(SELECT COUNT(*) FROM {w} x{index} WHERE x.queue = {queue} \
                 AND x.partition_key = {partition} AND {cond})"
            )
        };
        let ending_index = d.index(&w, "queue_held");
        // The running instances of `at`'s partition (all, and those of its
        // owner's), each sum read off two indexes: those running under a
        // live lease, and those cancelled or timed out while running, their
        // run not yet stopped (see `Store::release_ended`), whether or not a
        // retry has put them back in line since: still running, for the
        // limits. Such a hold is a lease expiry without an owner.
        let running_counts = |at: &Partition<'_>| {
            let Partition {
                queue,
                partition,
                now,
                owner,
                except,
            } = at;
            let running = format!("x.status = 'running' AND x.lease_expires_at >= {now}{except}");
            let ending = format!(
                "x.lease_owner IS NULL AND x.lease_expires_at IS NOT NULL \
                 AND x.lease_expires_at >= {now}{except}"
            );
            let count = |index: &str, cond: &str| count_in(index, queue, partition, cond);
            (
                format!(
                    "({} + {})",
                    count(&running_index, &running),
                    count(&ending_index, &ending),
                ),
                format!(
                    "({} + {})",
                    count(
                        &running_index,
                        &format!("{running} AND x.lease_owner = {owner}")
                    ),
                    count(&ending_index, &format!("{ending} AND x.held_by = {owner}")),
                ),
            )
        };
        // In the rooms statement: queue $3, partition `f.k`, now $2, the
        // claiming executor $1.
        let (running_or_ending, mine) = running_counts(&Partition {
            queue: "$3",
            partition: "f.k",
            now: "$2",
            owner: "$1",
            except: "",
        });
        // How many successors a hand-over in `at` may start: `wanted`, or
        // fewer where the limits (`concurrency`, `worker_concurrency`: NULL
        // for none) leave less room, never below zero (SQLite reads a
        // negative LIMIT as none). A hand-over of one slot keeps its
        // `LIMIT 1` and tests this for more than zero instead: PostgreSQL
        // plans a LIMIT it cannot read as a tenth of the rows, not the one
        // row the order index gives first.
        let room =
            |at: &Partition<'_>, concurrency: &str, worker_concurrency: &str, wanted: &str| {
                let (all, mine) = running_counts(at);
                format!(
                    "(SELECT CASE WHEN MIN(m.v) < 0 THEN 0 ELSE MIN(m.v) END FROM ( \
                     SELECT CAST({wanted} AS BIGINT) AS v \
                     UNION ALL SELECT {concurrency} - {all} \
                     UNION ALL SELECT {worker_concurrency} - {mine}) m)"
                )
            };
        // A row of alias `a` waiting to start at `now`: unfinished, due,
        // under no live lease (but those `own` admits), and not past its
        // deadline (`past_deadline` finds those, and a worker's sweep ends
        // them as timed out without a slot or a start).
        let waiting = |a: &str, now: &str, own: &str| {
            format!(
                "{a}.{unfinished} AND {a}.wake_at <= {now} \
                 AND ({a}.lease_owner IS NULL{own} OR {a}.lease_expires_at < {now}) \
                 AND ({a}.deadline IS NULL OR {a}.deadline > {now})"
            )
        };
        // A row the claiming owner ($1) may take now ($2), as `c`.
        let takeable = |now: &str| waiting("c", now, " OR c.lease_owner = $1");
        let order = "c.priority, c.created_at, c.id";
        // Starts the rows `picked` selects for owner `owner` under a lease
        // to `until` at `now` (their first start, for the rate limit, if it
        // is one); each names a placeholder.
        let start_as = |owner: &str, until: &str, now: &str, picked: String| {
            format!(
                "UPDATE {w} SET lease_owner = {owner}, lease_expires_at = {until}, \
                     wake_at = {until}, status = 'running', updated_at = {now}, \
                     queue_started_at = COALESCE(queue_started_at, {now}) \
                 WHERE {picked} RETURNING {columns}",
                columns = crate::sql::claimed_columns(d),
            )
        };
        let start = |picked: String| start_as("$1", "$2", "$3", picked);
        // The first row of `partition`'s share of queue `queue` in run order
        // under no live lease at `now` nor past its deadline (see
        // `takeable`), of workflow `name` with signature
        // `signature` and one of the versions (a JSON array) at `versions`,
        // read off the queue's order index; concurrent hand-overs skip each
        // other's (PostgreSQL). Only while no takeable row of another
        // workflow, signature or version (which this worker cannot run)
        // comes before it in the partition's run order: the slot then goes
        // back, and a claim, which serves every workflow in run order,
        // fills it, so priority and enqueue order hold across the queue's
        // workflows. Checked for each successor, read off the order index:
        // a hand-over that skipped a row another one is leasing (locked,
        // still takeable in this statement's snapshot) does not pass over
        // another workflow's row behind it, nor does a batch's later
        // successor.
        let successor = |queue: &str,
                         partition: &str,
                         now: &str,
                         name: &str,
                         signature: &str,
                         versions: &str,
                         limit: &str,
                         only_if: &str| {
            let versions = (d.json_text_elements)(versions);
            format!(
                "SELECT c.id FROM {w} c{order_index} WHERE c.queue = {queue}{only_if} \
                     AND c.partition_key = {partition} AND {waiting} \
                     AND c.name = {name} AND (c.signature IS NULL OR c.signature = {signature}) \
                     AND (c.app_version IS NULL OR c.app_version IN ({versions})) \
                     AND NOT EXISTS ({before} AND o.priority < c.priority{first}) \
                     AND NOT EXISTS ({before} AND o.priority = c.priority \
                         AND o.created_at <= c.created_at \
                         AND (o.created_at < c.created_at OR o.id < c.id){first}) \
                     ORDER BY {order} LIMIT {limit}{skip}",
                skip = d.skip_locked,
                waiting = waiting("c", now, ""),
                before = format!(
                    "SELECT 1 FROM {w} o{order_index} WHERE o.queue = {queue} \
                     AND o.partition_key = {partition} AND {waiting} \
                     AND NOT (o.name = {name} \
                         AND (o.signature IS NULL OR o.signature = {signature}) \
                         AND (o.app_version IS NULL OR o.app_version IN ({versions})))",
                    waiting = waiting("o", now, ""),
                ),
                first = FIRST_ONLY,
            )
        };
        // $1 owner, $2 lease expiry, $3 now, $4 how many, $5 queue, $6
        // partition, $7 the claimable application versions (a JSON array),
        // $8 on: the registered workflows. The partition's first takeable
        // rows in run order that also meet `only`, read off the queue's
        // order index.
        //
        // The pick locks its rows and passes over those locked
        // (PostgreSQL): a hand-over may be leasing one of them, and the
        // claim must not wait for it and then take it a second time (the
        // subquery's ids are not re-checked against the committed row).
        let claim = |only: &str| {
            start((d.picked_ids)(&format!(
                "SELECT c.id FROM {w} c{order_index} \
                     WHERE c.queue = $5 AND c.partition_key = $6 AND {takeable}{only} \
                     AND (c.app_version IS NULL OR c.app_version IN ({versions})) \
                     AND EXISTS (SELECT 1 FROM {registered} WHERE r.name = c.name \
                         AND (c.signature IS NULL OR c.signature = r.signature)) \
                     ORDER BY {order} LIMIT $4{skip}",
                takeable = takeable("$3"),
                versions = (d.json_text_elements)("$7"),
                registered = (d.registered_rows)(8),
                skip = d.skip_locked,
            )))
        };
        QueueStatements {
            lock: d.queue_lock,
            server_now_us: d.server_now_us,
            // $1 now, $2 how many at most: the queued instances past
            // their deadline that no live lease holds, earliest first.
            past_deadline: format!(
                "SELECT id FROM {w}{deadline_index} WHERE queue IS NOT NULL \
                 AND deadline IS NOT NULL AND {unfinished} AND deadline <= $1 \
                 AND (lease_owner IS NULL OR lease_expires_at < $1) \
                 ORDER BY deadline LIMIT $2",
                deadline_index = d.index(&w, "queue_deadline"),
            ),
            mark_queued: format!(
                "UPDATE {w} SET queue = $2, priority = $3, partition_key = $4, dedup_key = $5, \
                 wake_at = COALESCE($6, wake_at), created_at = COALESCE($7, created_at) \
                 WHERE id = $1"
            ),
            // Not when the new id exists already: that call attaches to it
            // (or is refused as another call), whoever holds the key now.
            find_duplicate: format!(
                "SELECT id FROM {w} WHERE queue = $1 AND dedup_key = $2 AND {unfinished} \
                 AND NOT EXISTS (SELECT 1 FROM {w} WHERE id = $3)"
            ),
            dedup_holder: format!(
                "SELECT o.id, o.queue, o.dedup_key FROM {w} me JOIN {w} o \
                 ON o.queue = me.queue AND o.dedup_key = me.dedup_key AND o.id <> me.id \
                 WHERE me.id = $1 AND o.{unfinished}"
            ),
            // $1 owner, $2 now, $3 queue, $4 the rate window's start. Every
            // partition with a takeable row, found by skipping through the
            // queue's index one key at a time (not by reading every row),
            // with its three counts, ordered by its first takeable row: the
            // partitions waiting longest are served first. (The order is
            // read by primary-key lookups, not by a join, which PostgreSQL
            // planned as a hash join over the whole table.)
            rooms: format!(
                "WITH RECURSIVE parts(k) AS ( \
                     SELECT MIN(partition_key) FROM {w}{unfinished_index} \
                         WHERE queue = $3 AND {unfinished} \
                     UNION ALL \
                     SELECT (SELECT MIN(x.partition_key) FROM {w} x{unfinished_index} \
                         WHERE x.queue = $3 \
                         AND x.{unfinished} AND x.partition_key > parts.k) \
                     FROM parts WHERE parts.k IS NOT NULL \
                 ), firsts AS ( \
                     SELECT parts.k, (SELECT c.id FROM {w} c{order_index} WHERE c.queue = $3 \
                         AND c.partition_key = parts.k AND {takeable} \
                         ORDER BY {order} LIMIT 1) AS first \
                     FROM parts WHERE parts.k IS NOT NULL \
                 ) \
                 SELECT f.k AS partition_key, {all} AS running, {mine} AS mine, \
                     {started} AS started \
                 FROM firsts f WHERE f.first IS NOT NULL \
                 ORDER BY (SELECT c.priority FROM {w} c WHERE c.id = f.first), \
                     (SELECT c.created_at FROM {w} c WHERE c.id = f.first), f.first",
                takeable = takeable("$2"),
                all = running_or_ending,
                mine = mine,
                started = count_in(&started_index, "$3", "f.k", "x.queue_started_at > $4"),
            ),
            claim_partition: claim(""),
            // As `claim_partition`, of instances started before only (see
            // `Store::claim_queue`).
            claim_started: claim(" AND c.queue_started_at IS NOT NULL"),
            // As `claim_partition`, of instances never started only.
            claim_fresh: claim(" AND c.queue_started_at IS NULL"),
            // $1 owner, $2 lease expiry, $3 now, $4 queue, $5 the finishing
            // instance (its end recorded in this transaction), $6 workflow
            // name, $7 its registered signature, $8 the claimable versions (a
            // JSON array), $9 and $10 the queue's `concurrency` and
            // `worker_concurrency`: the first successor of $5's partition,
            // started, if the partition has room for it.
            hand_over: {
                let partition = format!("(SELECT f.partition_key FROM {w} f WHERE f.id = $5)");
                let at = Partition {
                    queue: "$4",
                    partition: &partition,
                    now: "$3",
                    owner: "$1",
                    except: "",
                };
                start((d.picked_ids)(&successor(
                    "$4",
                    &partition,
                    "$3",
                    "$6",
                    "$7",
                    "$8",
                    "1",
                    &format!(" AND {} > 0", room(&at, "$9", "$10", "1")),
                )))
            },
            // As `hand_over`, with $5 the partition key itself, $9 how many
            // successors to start at most, $10 and $11 the limits.
            hand_over_partition: start((d.picked_ids)(&successor(
                "$4",
                "$5",
                "$3",
                "$6",
                "$7",
                "$8",
                &room(
                    &Partition {
                        queue: "$4",
                        partition: "$5",
                        now: "$3",
                        owner: "$1",
                        except: "",
                    },
                    "$10",
                    "$11",
                    "$9",
                ),
                "",
            ))),
            // $1 to $7 as the finish statement's (id, generation, owner,
            // status, output, error, now), $8 the successor's lease expiry,
            // $9 queue, $10 workflow name, $11 its signature, $12 the
            // claimable versions, $13 and $14 the queue's `concurrency` and
            // `worker_concurrency`. The finish applies only to an instance
            // without a parent (a child's end is also reported to its
            // parent, in a transaction): no row back means it did not
            // apply; a row of NULLs, that it applied with no successor.
            // Both updates commit together, so no claim's count of the
            // queue sees the slot both held and free. The room's counts
            // read the statement's snapshot, where the finishing instance
            // still runs: it is left out of them.
            finish_handing_over: d.modifying_ctes.then(|| {
                let at = Partition {
                    queue: "$9",
                    partition: "(SELECT partition_key FROM fin)",
                    now: "$7",
                    owner: "$3",
                    except: " AND x.id <> $1",
                };
                let room = room(&at, "$13", "$14", "1");
                let Partition {
                    queue,
                    partition,
                    now,
                    owner,
                    ..
                } = at;
                format!(
                    "WITH fin AS ({finish} AND parent_id IS NULL RETURNING partition_key), \
                     next AS ({next}) \
                     SELECT next.* FROM fin LEFT JOIN next ON true",
                    next = start_as(
                        owner,
                        "$8",
                        now,
                        (d.picked_ids)(&successor(
                            queue,
                            partition,
                            now,
                            "$10",
                            "$11",
                            "$12",
                            "1",
                            &format!(" AND {room} > 0"),
                        )),
                    ),
                )
            }),
        }
    }
}

/// Where a statement counts a queue partition's running instances, each
/// field a placeholder or an expression of its SQL.
struct Partition<'a> {
    /// The queue.
    queue: &'a str,
    /// The partition key.
    partition: &'a str,
    /// The time leases are live at.
    now: &'a str,
    /// The executor whose instances `worker_concurrency` counts.
    owner: &'a str,
    /// A condition on the counted rows (`x`) that leaves some out, or
    /// nothing.
    except: &'a str,
}

/// One partition of a queue with room, as the rooms statement reads it.
struct Room {
    partition: String,
    running: i64,
    mine: i64,
    started: i64,
}

impl Room {
    /// How many more of this partition `limits` let start now (`starts`:
    /// the rate limit's starts per window, `i64::MAX` without one).
    fn free(&self, limits: &QueueLimits<'_>, starts: i64) -> i64 {
        let room = |limit: Option<i64>, used: i64| limit.unwrap_or(i64::MAX).saturating_sub(used);
        room(limits.concurrency, self.running)
            .min(room(limits.worker_concurrency, self.mine))
            .min(starts.saturating_sub(self.started))
    }
}

impl Conn<'_> {
    /// The same connection, borrowed again for one more statement.
    pub(crate) fn reborrow(&mut self) -> Conn<'_> {
        match self {
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => Conn::Sqlite(c),
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => Conn::Postgres(c),
        }
    }
}

/// Runs `attempt` (a write that puts an instance in line on its queue) a
/// second time when it met the dedup key's unique index and could not name
/// the holder, its raw error: the holder took the key after the attempt's
/// check and finished before the read naming it, so the key is free again
/// and the second try goes through or names the next holder. A second such
/// race returns the index's error.
pub(crate) async fn twice_past_a_gone_holder<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    match attempt().await {
        Err(error) if is_unique_violation(&error) => attempt().await,
        other => other,
    }
}

/// Whether `error` is a unique-index violation (a racing duplicate that
/// passed the check before the insert).
fn is_unique_violation(error: &StoreError) -> bool {
    matches!(error, StoreError::Query { source, .. }
        if matches!(&**source, sqlx::Error::Database(db) if db.is_unique_violation()))
}

impl Store {
    /// Records a new instance on a queue, or returns the existing one with
    /// its id (the `bool` is `true` when this call created it). While an
    /// unfinished instance of the queue holds `queued.dedup`, a new one is
    /// refused with [`StoreError::Duplicate`].
    pub async fn create_queued(
        &self,
        new: &crate::NewInstance<'_>,
        queued: &Queued<'_>,
    ) -> Result<(InstanceRow, bool)> {
        let created_at = self.clock().creation_stamps(1);
        self.create_queued_at(new, queued, created_at).await
    }

    /// [`Store::create_queued`] with its creation stamp taken already.
    async fn create_queued_at(
        &self,
        new: &crate::NewInstance<'_>,
        queued: &Queued<'_>,
        created_at: i64,
    ) -> Result<(InstanceRow, bool)> {
        const OP: &str = "create_queued";
        crate::validate::validate_id("workflow id", new.id)?;
        crate::validate::validate_id("workflow name", new.name)?;
        check_dedup_has_queue(queued)?;
        let now = self.now_us();
        twice_past_a_gone_holder(|| async {
            // In a block of its own, so that an error inside (`?`) reaches
            // the duplicate check below instead of returning past it.
            let created = async {
                dispatch!(Store, self, |s| {
                    let mut tx = s.begin(OP).await?;
                    let created =
                        create_queued_on((&mut *tx).into(), new, queued, now, created_at).await?;
                    tx.commit().await.map_err(StoreError::query(OP))?;
                    Ok::<_, StoreError>(created)
                })
            }
            .await;
            match created {
                Err(error) if is_unique_violation(&error) => {
                    Err(self.duplicate_of(new, queued).await?.unwrap_or(error))
                }
                other => other,
            }
        })
        .await
    }

    /// Like [`Store::create_queued`] for several instances, in one
    /// transaction: one commit for all of them. A member refused (a live
    /// duplicate of its dedup key, before the batch or earlier in it) fails
    /// the whole call, with nothing written; the caller then records the
    /// members one by one to find which (as the writer does), each refused
    /// duplicate with [`StoreError::Duplicate`].
    pub async fn create_queued_many(
        &self,
        batch: &[(crate::NewInstance<'_>, Queued<'_>)],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        // Created a microsecond apart in batch order (the order the calls
        // were made), after every instance this store created before, so
        // the queue's run order (priority, then creation) keeps it among
        // equals, not the ids' order.
        let first = self.clock().creation_stamps(batch.len());
        let stamps: Vec<i64> = (0..batch.len() as i64).map(|i| first + i).collect();
        self.create_queued_stamped(batch, &stamps).await
    }

    /// [`Store::create_queued_many`] with each member's creation stamp
    /// taken already (`stamps[i]` for `batch[i]`), as the writer takes them
    /// when each call is made.
    pub(crate) async fn create_queued_stamped(
        &self,
        batch: &[(crate::NewInstance<'_>, Queued<'_>)],
        stamps: &[i64],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        const OP: &str = "create_queued";
        debug_assert_eq!(batch.len(), stamps.len());
        if let ([(new, queued)], [created_at]) = (batch, stamps) {
            return Ok(vec![self.create_queued_at(new, queued, *created_at).await?]);
        }
        for (new, queued) in batch {
            crate::validate::validate_id("workflow id", new.id)?;
            crate::validate::validate_id("workflow name", new.name)?;
            check_dedup_has_queue(queued)?;
        }
        let now = self.now_us();
        // Inserted in id order, and the dedup keys taken one at a time in
        // key order: two batches (of this process's writer, or of two
        // processes) that share ids or keys then wait on each other in one
        // direction, never in a cycle (a deadlock would fail both batches
        // whole, every enqueue in them).
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_by_key(|&i| batch[i].0.id);
        let news: Vec<crate::NewInstance<'_>> = order.iter().map(|&i| batch[i].0.clone()).collect();
        let queued: Vec<&Queued<'_>> = order.iter().map(|&i| &batch[i].1).collect();
        let stamp = |i: usize| stamps[i];
        let ordered_stamps: Vec<i64> = order.iter().map(|&i| stamp(i)).collect();
        dispatch!(Store, self, |s| {
            let mut tx = s.begin_batch(OP).await?;
            for (new, queued) in batch {
                if let Some(key) = queued.dedup {
                    let found = find_duplicate((&mut *tx).into(), new, queued, key).await?;
                    if let Some(duplicate) = found {
                        return crate::query::rolled_back(tx, OP, ())
                            .await
                            .and(Err(duplicate));
                    }
                }
            }
            // One outcome per instance (or an error), in `news` order: put
            // back in batch order.
            let inserted =
                insert_queued((&mut *tx).into(), &news, &queued, &ordered_stamps, now).await?;
            let mut placed: Vec<(usize, (InstanceRow, bool))> =
                order.iter().copied().zip(inserted).collect();
            placed.sort_by_key(|(i, _)| *i);
            let mut created: Vec<(InstanceRow, bool)> =
                placed.into_iter().map(|(_, outcome)| outcome).collect();
            // The dedup keys, one at a time in key order.
            let mut keyed: Vec<(&str, &Queued<'_>, i64)> = batch
                .iter()
                .zip(&created)
                .enumerate()
                .filter(|(_, ((_, queued), (_, created)))| *created && queued.dedup.is_some())
                .map(|(i, ((new, queued), _))| (new.id, queued, stamp(i)))
                .collect();
            keyed.sort_by_key(|(id, queued, _)| (queued.queue, queued.dedup, *id));
            for (id, queued, at) in keyed {
                mark_queued((&mut *tx).into(), id, queued, Some(at)).await?;
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            for (i, ((_, queued), (row, created))) in batch.iter().zip(&mut created).enumerate() {
                if !*created {
                    continue;
                }
                row.created_at = stamp(i);
                if let Some(at) = queued.not_before {
                    row.wake_at = Some(at);
                }
            }
            Ok(created)
        })
    }

    /// [`dedup_taken`] on a pooled connection.
    pub(crate) async fn dedup_taken(&self, id: &str) -> Result<Option<StoreError>> {
        dispatch!(Store, self, |s| {
            let mut conn = s.acquire("dedup_taken").await?;
            let found = dedup_taken((&mut *conn).into(), id).await?;
            conn.done("dedup_taken").await?;
            Ok(found)
        })
    }

    /// `error`, met putting instance `id` back in line after [`dedup_taken`]
    /// found its key free: when it is the dedup key's unique index (an
    /// enqueue committed the key between the check and the update), the
    /// [`StoreError::Duplicate`] naming who holds the key now.
    pub(crate) async fn key_taken_meanwhile(&self, id: &str, error: StoreError) -> StoreError {
        if !is_unique_violation(&error) {
            return error;
        }
        match self.dedup_taken(id).await {
            Ok(found) => found.unwrap_or(error),
            Err(read) => read,
        }
    }

    /// The [`StoreError::Duplicate`] a conflicting `new` met, if its id is
    /// not itself taken (then the conflict was something else).
    async fn duplicate_of(
        &self,
        new: &crate::NewInstance<'_>,
        queued: &Queued<'_>,
    ) -> Result<Option<StoreError>> {
        let Some(key) = queued.dedup else {
            return Ok(None);
        };
        dispatch!(Store, self, |s| {
            let mut conn = s.acquire("create_queued").await?;
            let found = find_duplicate((&mut *conn).into(), new, queued, key).await?;
            conn.done("create_queued").await?;
            Ok(found)
        })
    }

    /// Claims up to `limit` due instances of queue `limits.name` for
    /// `lease.owner`, lowest priority first and then in creation order,
    /// within the queue's limits (see the module docs for how they count and
    /// why the claim is race-free). Like [`Store::claim_due`], it takes only
    /// instances of a registered signature and of one of `versions` (or
    /// unversioned).
    pub async fn claim_queue(
        &self,
        lease: Lease<'_>,
        workflows: &[Registered<'_>],
        versions: &[&str],
        limits: &QueueLimits<'_>,
        limit: i64,
    ) -> Result<Vec<InstanceRow>> {
        const OP: &str = "claim_queue";
        let versions = crate::versions::versions_json(versions);
        let clock = self.clock();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            if let Some(lock) = sql.queue.lock {
                crate::prepared::query(lock)
                    .bind(limits.name)
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            }
            // Read once the queue is this claim's alone (SQLite's write lock
            // came with the `BEGIN`): a claim that waited for another counts
            // the leases live now, and its leases and starts date from now.
            // A rate limit's window counts starts that workers on many
            // hosts stamped: on PostgreSQL they are stamped and counted by
            // the server's clock, so a worker whose clock is behind another's
            // (within the skew limit) does not see the other's starts fall
            // out of the window early. (Not under a manual clock, a test's.)
            let now = match (limits.rate_limit, sql.queue.server_now_us) {
                (Some(_), Some(server_now)) if !clock.is_manual() => {
                    crate::prepared::query_scalar::<_, i64>(server_now)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?
                }
                _ => clock.now_us(),
            };
            let (starts, window_start) = match limits.rate_limit {
                Some((starts, period_us)) => (starts, now.saturating_sub(period_us)),
                None => (i64::MAX, i64::MAX),
            };
            let expires = now + lease.ttl_us;
            let what = || format!("queue `{}`", limits.name);
            let rooms = bind_all!(
                crate::prepared::query(&sql.queue.rooms),
                &args![lease.owner, now, limits.name, window_start]
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(OP))?
            .iter()
            .map(|row| {
                Ok(Room {
                    partition: row.text(what, "partition_key")?,
                    running: row.int(what, "running")?,
                    mine: row.int(what, "mine")?,
                    started: row.int(what, "started")?,
                })
            })
            .collect::<Result<Vec<Room>>>()?;
            let mut claimed = Vec::new();
            for room in rooms {
                let left = limit - claimed.len() as i64;
                if left <= 0 {
                    break;
                }
                // An instance that started before (resuming after a
                // suspension or a retry, or after its worker was lost) is
                // no new start: only the concurrency limits hold it back.
                let slots = room.free(limits, i64::MAX).min(left);
                let fresh = room.free(limits, starts).min(left);
                // With a rate limit, those go first, then new starts in the
                // slots left, as many as the window allows; without one, all
                // in run order.
                let passes: &[(&String, bool)] = match limits.rate_limit {
                    None => &[(&sql.queue.claim_partition, false)],
                    Some(_) => &[
                        (&sql.queue.claim_started, false),
                        (&sql.queue.claim_fresh, true),
                    ],
                };
                let mut took = 0;
                for &(statement, new_starts) in passes {
                    let take = match new_starts {
                        false => slots,
                        true => fresh.min(slots - took),
                    };
                    if take <= 0 {
                        continue;
                    }
                    let args = args![
                        lease.owner,
                        expires,
                        now,
                        take,
                        limits.name,
                        room.partition.as_str(),
                        &versions,
                    ];
                    let query = bind_all!(crate::prepared::query(statement), &args);
                    let rows = s
                        .bind_registered(query, workflows)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(StoreError::query(OP))?;
                    took += rows.len() as i64;
                    for row in &rows {
                        claimed.push(Claimed::from_row(row)?.0);
                    }
                }
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(claimed)
        })
    }
}

/// A row of the finish-and-hand-over statement: the successor handed the
/// slot, or `None` (all columns NULL) when the partition had none.
struct HandedTo(Option<InstanceRow>);

/// The id of a queued instance past its deadline.
struct PastDeadline(String);

impl FromRow for PastDeadline {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        row.text(|| "a queued instance past its deadline".into(), "id")
            .map(PastDeadline)
    }
}

impl Store {
    /// Up to `limit` unfinished queued instances whose deadline has passed
    /// and that no live lease holds (waiting for a slot, suspended, or
    /// left by a run whose lease lapsed), earliest deadline first. A
    /// queue's claims and hand-overs leave such an instance, which would
    /// otherwise take a slot (and, on a rate-limited queue, a start) only
    /// to be ended: the caller times each out instead
    /// ([`Store::time_out`]).
    pub async fn queued_past_deadline(&self, limit: i64) -> Result<Vec<String>> {
        let ids: Vec<PastDeadline> = self
            .fetch_all(
                "queued_past_deadline",
                |s| &s.queue.past_deadline,
                &args![self.now_us(), limit],
                None,
            )
            .await?;
        Ok(ids.into_iter().map(|PastDeadline(id)| id).collect())
    }
}

impl FromRow for HandedTo {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        match row.maybe_text(|| "a queue's hand-over".into(), "id")? {
            Some(_) => Claimed::from_row(row).map(|Claimed(row)| HandedTo(Some(row))),
            None => Ok(HandedTo(None)),
        }
    }
}

impl Store {
    /// [`Store::finish_handing_over`] of one finish and its hand-over in one
    /// autocommitted statement, where the backend has one: `None` when it
    /// has none or the finish did not apply (a child's, which also reports
    /// to its parent, or one whose lease was lost), so the caller takes the
    /// transaction; else the successor handed the slot, if any.
    pub(crate) async fn finish_alone_handing_over(
        &self,
        finish: &crate::Finish<'_>,
        hand_over: &HandOver,
        now: i64,
    ) -> Result<Option<Option<InstanceRow>>> {
        // The finish statement's parameters, then the hand-over's.
        let args: Vec<crate::query::Arg<'_>> = crate::journal::finish_args(finish, now)
            .into_iter()
            .chain(args![
                now + hand_over.ttl_us,
                hand_over.queue.as_str(),
                hand_over.name.as_str(),
                hand_over.signature.as_str(),
                hand_over.versions.as_str(),
                hand_over.concurrency,
                hand_over.worker_concurrency,
            ])
            .collect();
        let handed = dispatch!(Store, self, |s, sql| {
            let Some(statement) = &sql.queue.finish_handing_over else {
                return Ok(None);
            };
            let row = bind_all!(crate::prepared::query(statement), &args)
                .fetch_optional(s.exec())
                .await
                .map_err(StoreError::query("finish"))?;
            row.as_ref().map(HandedTo::from_row).transpose()?
        });
        Ok(handed.map(|HandedTo(successor)| successor))
    }
}

/// Records `new` on its queue in the caller's transaction, like
/// [`Store::create_queued`], at `clock`'s time (the store's:
/// [`Store::clock`]), its creation stamped by
/// [`Clock::creation_stamps`](crate::Clock::creation_stamps). With a dedup
/// key the writes run under a savepoint: an enqueue that commits the same key while this one
/// waits (PostgreSQL) is refused with [`StoreError::Duplicate`] naming it,
/// and the caller's transaction stays usable, holding nothing of this call.
pub async fn create_queued_tx<'t, 'c>(
    tx: impl Into<crate::TimerTx<'t, 'c>>,
    new: &crate::NewInstance<'_>,
    queued: &Queued<'_>,
    clock: &crate::Clock,
) -> Result<(InstanceRow, bool)>
where
    'c: 't,
{
    crate::validate::validate_id("workflow id", new.id)?;
    crate::validate::validate_id("workflow name", new.name)?;
    check_dedup_has_queue(queued)?;
    let (now, created_at) = (clock.now_us(), clock.creation_stamps(1));
    let mut tx = tx.into();
    let created = match queued.dedup {
        None => create_queued_on(tx.reborrow().into(), new, queued, now, created_at).await?,
        Some(key) => {
            savepoint(tx.reborrow().into(), "SAVEPOINT keiro_enqueue").await?;
            match create_queued_on(tx.reborrow().into(), new, queued, now, created_at).await {
                Ok(created) => {
                    savepoint(tx.reborrow().into(), "RELEASE SAVEPOINT keiro_enqueue").await?;
                    created
                }
                Err(error) => {
                    let mut back =
                        savepoint(tx.reborrow().into(), "ROLLBACK TO SAVEPOINT keiro_enqueue")
                            .await;
                    if back.is_ok() {
                        back = savepoint(tx.reborrow().into(), "RELEASE SAVEPOINT keiro_enqueue")
                            .await;
                    }
                    if let Err(rollback) = back {
                        // The transaction is gone with it (SQLite ends one
                        // on a full disk): the call's own error says why.
                        tracing::warn!(%rollback, "keiro could not roll back a refused enqueue");
                        return Err(error);
                    }
                    if !is_unique_violation(&error) {
                        return Err(error);
                    }
                    // The other enqueue committed the key first: name it.
                    // When this transaction's snapshot (REPEATABLE READ or
                    // SERIALIZABLE) predates that commit, it cannot see the
                    // holder: a conflict with a concurrent transaction,
                    // which running the transaction again gets past.
                    let found = find_duplicate(tx.reborrow().into(), new, queued, key).await?;
                    return Err(found.unwrap_or_else(|| StoreError::Conflict {
                        step: "enqueue_tx",
                        reason: format!(
                            "dedup key `{key}` of queue `{}` was taken by a transaction this \
                             one cannot see (it committed after this one's snapshot, or \
                             finished again already) ({error}); run the transaction again",
                            queued.queue.unwrap_or("")
                        ),
                    }));
                }
            }
        }
    };
    if created.1 {
        crate::outbox::notify_on(tx.into(), "").await?;
    }
    Ok(created)
}

/// Runs savepoint statement `statement` on `conn` (a transaction), prepared
/// unnamed: no statement is left on the server, where behind a
/// transaction-pooling proxy another client would meet it.
async fn savepoint(conn: Conn<'_>, statement: &'static str) -> Result<()> {
    dispatch!(Conn, conn, |c| {
        sqlx::query(statement)
            .persistent(false)
            .execute(&mut *c)
            .await
            .map(drop)
            .map_err(StoreError::query("create_queued"))
    })
}

/// Records `new` on its queue on `conn` (a transaction): refuses a live
/// duplicate, inserts it like any instance, then marks it queued.
async fn create_queued_on(
    mut conn: Conn<'_>,
    new: &crate::NewInstance<'_>,
    queued: &Queued<'_>,
    now: i64,
    created_at: i64,
) -> Result<(InstanceRow, bool)> {
    if let Some(key) = queued.dedup {
        if let Some(duplicate) = find_duplicate(conn.reborrow(), new, queued, key).await? {
            return Err(duplicate);
        }
    }
    let (mut row, created) = crate::journal::create_instance_on(conn.reborrow(), new, now).await?;
    if created {
        mark_queued(conn, new.id, queued, Some(created_at)).await?;
        row.created_at = created_at;
        if let Some(at) = queued.not_before {
            row.wake_at = Some(at);
        }
    }
    Ok((row, created))
}

/// Puts instance `id` (just created on `conn`, a transaction) on its queue
/// as `queued` says, dedup key included, created at `created_at` when given.
async fn mark_queued(
    conn: Conn<'_>,
    id: &str,
    queued: &Queued<'_>,
    created_at: Option<i64>,
) -> Result<()> {
    let args = args![
        id,
        queued.queue,
        queued.priority,
        queued.partition,
        queued.dedup,
        queued.not_before,
        created_at,
    ];
    dispatch!(Conn, conn, |c, sql| {
        bind_all!(crate::prepared::query(&sql.queue.mark_queued), &args)
            .execute(&mut *c)
            .await
            .map(|_| ())
            .map_err(StoreError::query("create_queued"))
    })
}

/// Inserts `news` on `conn` (a transaction), those it creates placed on
/// their queues as `queued` (same position) says, all but their dedup keys
/// (the caller takes those in key order), and created at `stamps` (same
/// position; `now` is the batch's time): one outcome per instance, in
/// `news` order. PostgreSQL places them in the insert itself; SQLite marks
/// them after it, in one statement per [`MARK_CHUNK`].
async fn insert_queued(
    conn: Conn<'_>,
    news: &[crate::NewInstance<'_>],
    queued: &[&Queued<'_>],
    stamps: &[i64],
    now: i64,
) -> Result<Vec<(InstanceRow, bool)>> {
    match conn {
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => {
            crate::postgres::journal::create_many_queued_on(c, news, queued, stamps, now).await
        }
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => {
            let created = crate::sqlite::journal::create_many_on(c, news, now).await?;
            let plain: Vec<(&str, &Queued<'_>, i64)> = news
                .iter()
                .zip(queued)
                .zip(stamps)
                .zip(&created)
                .filter(|(((_, queued), _), (_, created))| *created && queued.dedup.is_none())
                .map(|(((new, queued), at), _)| (new.id, *queued, *at))
                .collect();
            for chunk in plain.chunks(MARK_CHUNK) {
                let mut query = crate::prepared::query(sqlite_mark_many(chunk.len()));
                for (id, queued, at) in chunk {
                    query = query
                        .bind(*id)
                        .bind(queued.queue)
                        .bind(queued.priority)
                        .bind(queued.partition)
                        .bind(queued.dedup)
                        .bind(queued.not_before)
                        .bind(*at);
                }
                query
                    .execute(&mut *c)
                    .await
                    .map_err(StoreError::query("create_queued"))?;
            }
            Ok(created)
        }
    }
}

/// Instances per statement of [`insert_queued`]'s marks on SQLite (seven
/// parameters each).
#[cfg(feature = "sqlite")]
const MARK_CHUNK: usize = 64;

/// SQLite's statement marking `rows` instances queued (1 ..= [`MARK_CHUNK`]):
/// seven parameters a row (id, queue, priority, partition, dedup key, not
/// before, creation time), as `mark_queued` takes them.
#[cfg(feature = "sqlite")]
fn sqlite_mark_many(rows: usize) -> &'static str {
    static MARK_MANY: [std::sync::OnceLock<String>; MARK_CHUNK] =
        [const { std::sync::OnceLock::new() }; MARK_CHUNK];
    MARK_MANY[rows - 1].get_or_init(|| {
        format!(
            "WITH q(id, queue, priority, partition_key, dedup_key, not_before, created_at) \
                 AS (VALUES {}) \
             UPDATE keiro_workflows SET queue = q.queue, priority = q.priority, \
                 partition_key = q.partition_key, dedup_key = q.dedup_key, \
                 wake_at = COALESCE(q.not_before, keiro_workflows.wake_at), \
                 created_at = q.created_at \
             FROM q WHERE keiro_workflows.id = q.id",
            crate::sqlite::journal::anonymous_rows(7, rows)
        )
    })
}

/// Hands `finish`'s queue slot over on `conn` (the transaction that just
/// recorded the finish) as `hand_over` says: the successor it claimed for
/// `finish.owner`, if its partition had one.
pub(crate) async fn hand_over_on(
    conn: Conn<'_>,
    finish: &crate::Finish<'_>,
    hand_over: &HandOver,
    now: i64,
) -> Result<Option<InstanceRow>> {
    let args = args![
        finish.owner,
        now + hand_over.ttl_us,
        now,
        hand_over.queue.as_str(),
        finish.id,
        hand_over.name.as_str(),
        hand_over.signature.as_str(),
        hand_over.versions.as_str(),
        hand_over.concurrency,
        hand_over.worker_concurrency,
    ];
    dispatch!(Conn, conn, |c, sql| {
        bind_all!(crate::prepared::query(&sql.queue.hand_over), &args)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query("hand_over"))?
            .map(|row| Claimed::from_row(&row).map(|Claimed(row)| row))
            .transpose()
    })
}

/// An applied finish whose slot [`hand_over_all_on`] hands over.
pub(crate) struct Handing<'a, 'f> {
    pub(crate) finish: &'a crate::Finish<'f>,
    pub(crate) hand_over: &'a HandOver,
    /// The finished instance's partition key, when the batch finish
    /// returned it (one by one, finishes do not).
    pub(crate) partition: Option<&'a str>,
}

/// Hands over the slots of several applied finishes on `conn` (the
/// transaction that recorded them), like [`hand_over_on`] for each, in a
/// statement per partition instead of one per finish: the finishes a
/// writer round carries on a busy queue mostly share a partition, and each
/// statement costs a trip to the database. A partition's successors are
/// its first takeable instances in run order, one to each of its finishes
/// while they last (all go to the same owner, so which finish gets which
/// does not matter). One successor or none per finish, in `handing` order.
pub(crate) async fn hand_over_all_on(
    mut conn: Conn<'_>,
    handing: &[Handing<'_, '_>],
    now: i64,
) -> Result<Vec<Option<InstanceRow>>> {
    // Finishes recorded one by one (a lone one, or a batch naming one
    // instance twice) did not read their partitions: one statement each.
    let partitions: Option<Vec<&str>> = handing.iter().map(|h| h.partition).collect();
    let Some(partitions) = partitions.filter(|_| handing.len() > 1) else {
        let mut successors = Vec::with_capacity(handing.len());
        for h in handing {
            successors.push(hand_over_on(conn.reborrow(), h.finish, h.hand_over, now).await?);
        }
        return Ok(successors);
    };
    // The finishes whose successors one statement starts: the same owner,
    // hand-over and partition, in first-seen order.
    let mut groups: Vec<(usize, &str, Vec<usize>)> = Vec::new();
    for (i, (h, &partition)) in handing.iter().zip(&partitions).enumerate() {
        let same = |&(first, p, _): &(usize, &str, Vec<usize>)| {
            let other = &handing[first];
            p == partition && other.finish.owner == h.finish.owner && other.hand_over == h.hand_over
        };
        match groups.iter_mut().find(|group| same(group)) {
            Some((_, _, members)) => members.push(i),
            None => groups.push((i, partition, vec![i])),
        }
    }
    let mut successors: Vec<Option<InstanceRow>> = vec![None; handing.len()];
    for (first, partition, members) in groups {
        let Handing {
            finish, hand_over, ..
        } = handing[first];
        let args = args![
            finish.owner,
            now + hand_over.ttl_us,
            now,
            hand_over.queue.as_str(),
            partition,
            hand_over.name.as_str(),
            hand_over.signature.as_str(),
            hand_over.versions.as_str(),
            members.len() as i64,
            hand_over.concurrency,
            hand_over.worker_concurrency,
        ];
        let started: Vec<InstanceRow> = dispatch!(Conn, conn.reborrow(), |c, sql| {
            bind_all!(
                crate::prepared::query(&sql.queue.hand_over_partition),
                &args
            )
            .fetch_all(&mut *c)
            .await
            .map_err(StoreError::query("hand_over"))?
            .iter()
            .map(|row| Claimed::from_row(row).map(|Claimed(row)| row))
            .collect::<Result<_>>()?
        });
        for (member, row) in members.into_iter().zip(started) {
            successors[member] = Some(row);
        }
    }
    Ok(successors)
}

/// Refuses a dedup key without a named queue: the default queue keeps no
/// keys (its unique index covers named queues only), so the key would be
/// silently ignored.
fn check_dedup_has_queue(queued: &Queued<'_>) -> Result<()> {
    match (queued.dedup, queued.queue) {
        (Some(key), None) => Err(StoreError::InvalidId {
            what: "dedup key",
            value_preview: crate::validate::preview(key),
            reason: "a dedup key holds within a named queue, and this instance goes on the \
                     default queue; name its queue, or leave the key out"
                .to_owned(),
        }),
        _ => Ok(()),
    }
}

/// The [`StoreError::Duplicate`] that putting instance `id` back in line
/// would meet: another unfinished instance took its queue's dedup key since
/// it ended (a cancel, a failure or a set-aside release the key). `None`
/// when it has no key or the key is free.
pub(crate) async fn dedup_taken(conn: Conn<'_>, id: &str) -> Result<Option<StoreError>> {
    const OP: &str = "dedup_taken";
    let holder: Option<(String, Option<String>, Option<String>)> =
        dispatch!(Conn, conn, |c, sql| {
            crate::prepared::query_as(&sql.queue.dedup_holder)
                .bind(id)
                .fetch_optional(&mut *c)
                .await
                .map_err(StoreError::query(OP))
        })?;
    Ok(
        holder.map(|(existing_id, queue, key)| StoreError::Duplicate {
            queue: queue.unwrap_or_default(),
            key: key.unwrap_or_default(),
            existing_id,
        }),
    )
}

/// The unfinished instance of `queued`'s queue holding dedup `key`, as the
/// [`StoreError::Duplicate`] refusing `new` (none when it is `new` itself).
async fn find_duplicate(
    conn: Conn<'_>,
    new: &crate::NewInstance<'_>,
    queued: &Queued<'_>,
    key: &str,
) -> Result<Option<StoreError>> {
    let queue = queued.queue.unwrap_or_default();
    let existing: Option<String> = dispatch!(Conn, conn, |c, sql| {
        crate::prepared::query(&sql.queue.find_duplicate)
            .bind(queue)
            .bind(key)
            .bind(new.id)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query("create_queued"))?
            .map(|row| row.text(|| format!("queue `{queue}`"), "id"))
            .transpose()
    })?;
    Ok(existing
        .filter(|id| id != new.id)
        .map(|existing_id| StoreError::Duplicate {
            queue: queue.to_owned(),
            key: key.to_owned(),
            existing_id,
        }))
}
