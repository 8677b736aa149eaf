//! The statements both backends share, written once.
//!
//! sqlx-sqlite accepts PostgreSQL's `$N` placeholders, so a statement differs
//! between the backends only in its table names (`keiro_workflows` on SQLite,
//! `keiro.workflows` on PostgreSQL) and in the few spots a [`Dialect`] names.
//! Each backend builds its [`Statements`] once, on first use, and every call
//! after that borrows the text: nothing is formatted on the hot path.

use crate::outcome::child_outcome_sql;

/// What differs between the backends' spelling of a shared statement.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// What each table name starts with (`keiro_`, `keiro.`).
    pub(crate) tables: &'static str,
    /// Appended to a read that must lock its row until the transaction ends
    /// (PostgreSQL `FOR UPDATE`; SQLite's `BEGIN IMMEDIATE` already does).
    pub(crate) lock_row: &'static str,
    /// Appended to a claim's candidate scan so concurrent claimers pass over
    /// each other's rows (PostgreSQL `FOR UPDATE SKIP LOCKED`).
    pub(crate) skip_locked: &'static str,
    /// Appended to a timer payload parameter to store it as JSON
    /// (PostgreSQL `::json`; SQLite's column checks `json_valid`).
    pub(crate) json_param: &'static str,
    /// The JSON object constructor (`json_object`, `json_build_object`).
    pub(crate) json_object: &'static str,
    /// Turns a JSON value into text (PostgreSQL `::text`).
    pub(crate) json_as_text: &'static str,
    /// The 1-based position of a substring, 0 when absent (`instr(haystack,
    /// needle)`, `strpos(haystack, needle)`).
    pub(crate) find_text: &'static str,
    /// The condition a claimable instance's `name` and `signature` meet,
    /// given the worker's registered workflows bound from placeholder `$n` on.
    pub(crate) registered_match: fn(n: usize) -> String,
    /// The text elements of the JSON array bound at the given placeholder,
    /// as a one-column `SELECT` (for `x IN (…)`).
    pub(crate) json_text_elements: fn(param: &str) -> String,
    /// The worker's registered workflows bound from placeholder `$n` on, as
    /// a table `r(name, signature)`.
    pub(crate) registered_rows: fn(n: usize) -> String,
    /// Whether `WITH` may hold `INSERT`/`UPDATE` (PostgreSQL), so a
    /// message's send or take is one round trip instead of several.
    pub(crate) modifying_ctes: bool,
    /// The channel a sent message notifies in the statement that queues it
    /// (PostgreSQL, delivered at commit); `None` where workers share the
    /// process.
    pub(crate) wake_channel: Option<&'static str>,
    /// The channel a new or moved timer notifies in the statement that writes
    /// it (PostgreSQL); `None` where workers share the process.
    pub(crate) timer_channel: Option<&'static str>,
    /// Taken before a queue's claim (queue name at `$1`) so claims of one
    /// queue from many processes run one at a time (PostgreSQL); `None`
    /// where `BEGIN IMMEDIATE` serialises them already.
    pub(crate) queue_lock: Option<&'static str>,
    /// Reads the database server's clock, in µs since the Unix epoch
    /// (PostgreSQL); `None` where the database shares this host's clock. A
    /// rate-limited queue's claim, which holds the queue's lock, counts and
    /// stamps first starts by it, so workers whose clocks differ count one
    /// window.
    pub(crate) server_now_us: Option<&'static str>,
    /// The condition "`id` is one of the ids the subquery `sub` picks", for
    /// an `UPDATE` of a claim's picked rows. PostgreSQL spells it
    /// `id = ANY(ARRAY(sub))`: its generic plan for `id IN (sub)` hash-joins
    /// the picked ids against the whole table instead of looking each up.
    pub(crate) picked_ids: fn(sub: &str) -> String,
    /// Whether a read names the index it must use (SQLite's `INDEXED BY`).
    /// Left to itself SQLite read the due-order reads by status (every
    /// unfinished instance, sorted), and once `ANALYZE` or `PRAGMA optimize`
    /// had written statistics SQLite 3.40 planned a queue's hand-over so too
    /// (see `sqlite/plans.rs`); PostgreSQL has no such clause.
    pub(crate) indexed_by: bool,
}

impl Dialect {
    /// A dialect whose tables start with `tables`, with no locking clauses,
    /// casts or notifications: the SQLite one, and what PostgreSQL's
    /// overrides.
    pub(crate) const fn plain(
        tables: &'static str,
        registered_match: fn(usize) -> String,
        registered_rows: fn(usize) -> String,
        json_text_elements: fn(&str) -> String,
    ) -> Dialect {
        Dialect {
            tables,
            lock_row: "",
            skip_locked: "",
            json_param: "",
            json_object: "json_object",
            json_as_text: "",
            find_text: "instr",
            timer_channel: None,
            registered_match,
            registered_rows,
            json_text_elements,
            modifying_ctes: false,
            wake_channel: None,
            queue_lock: None,
            server_now_us: None,
            picked_ids: in_subquery,
            indexed_by: true,
        }
    }

    /// ` INDEXED BY {table}_{index}` where reads name their index, else
    /// nothing: appended to `{table} alias` in a `FROM`.
    pub(crate) fn index(&self, table: &str, index: &str) -> String {
        match self.indexed_by {
            true => format!(" INDEXED BY {table}_{index}"),
            false => String::new(),
        }
    }
}

/// `id IN (sub)`: how SQLite tests an id against a claim's picked ids.
fn in_subquery(sub: &str) -> String {
    format!("id IN ({sub})")
}

/// The columns of an [`crate::InstanceRow`], in `SELECT` and `RETURNING` lists.
pub(crate) const INSTANCE_COLUMNS: &str = "id, name, generation, status, input, first_input, \
     signature, output, error, attempts, lease_owner, lease_expires_at, wake_at, parent_id, \
     parent_seq, deadline, traceparent, app_version, skeleton_hash, created_at, updated_at";

/// The `RETURNING` list of a claim in `d`'s dialect: [`INSTANCE_COLUMNS`],
/// then `fresh`, whether the claimed generation has no journal row yet, so
/// the run it starts skips reading an empty journal (decoded by
/// `rows::Claimed`).
///
/// It is a scalar subquery with `LIMIT 1`, one primary-key probe per row,
/// not `NOT EXISTS`: PostgreSQL may run an `EXISTS` outside `WHERE` as a
/// hashed subplan that reads every step row of the store once per claim (a
/// generic plan made while the table was small did so, and halved a queue's
/// throughput by the end of a 10,000-instance run).
pub(crate) fn claimed_columns(d: &Dialect) -> String {
    let (w, s) = (
        format!("{}workflows", d.tables),
        format!("{}steps", d.tables),
    );
    format!(
        "{INSTANCE_COLUMNS}, (SELECT 1 FROM {s} j \
         WHERE j.workflow_id = {w}.id AND j.generation = {w}.generation LIMIT 1) IS NULL \
         AS fresh"
    )
}

/// The columns of a [`crate::StepRow`].
pub(crate) const STEP_COLUMNS: &str = "workflow_id, generation, seq, name, kind, result";

/// The columns of an [`crate::ExecutorRow`].
const EXECUTOR_COLUMNS: &str = "id, token, host, pid, heartbeat_at";

/// The columns of a [`crate::TimerRow`] (the payload as text on either backend).
pub(crate) const TIMER_COLUMNS: &str = "id, process_manager, correlation_id, fire_at, \
     CAST(payload AS TEXT) AS payload, status, attempts, last_error, event_id, claimed_at, \
     resume_lease_until, created_at, updated_at";

/// How many of the longest-due instances a look for blocked ones reads.
/// Reading the whole backlog cost a worker time in proportion to it (17 ms
/// at 10,000 queued instances on PostgreSQL). A blocked instance is never
/// claimed, so it keeps its place in the due order: one behind a longer
/// backlog is reported once the backlog ahead of it shrinks below this.
const BLOCKED_SCAN: i64 = 5_000;

/// The statuses of an instance that may still run.
const UNFINISHED: &str = "status IN ('pending', 'running', 'suspended')";

/// One backend's text of every shared statement. Placeholders are documented
/// by the operation that binds them.
#[derive(Debug)]
pub(crate) struct Statements {
    // Journal.
    pub(crate) insert_instance: String,
    /// An instance without a parent or a deadline inserted as already
    /// ended, unless its id exists: one statement, so it commits alone.
    pub(crate) insert_ended: String,
    pub(crate) get_instance: String,
    pub(crate) claim: String,
    pub(crate) renew_lease: String,
    pub(crate) release: String,
    /// Drops the hold a cancelled or timed-out run of a named queue kept
    /// on its slot (see `cancel_one`).
    pub(crate) release_ended: String,
    pub(crate) load_journal: String,
    pub(crate) get_step: String,
    pub(crate) insert_step: String,
    /// Removes one step row (one its own transaction inserted).
    pub(crate) delete_step: String,
    pub(crate) step_of_kind_exists: String,
    pub(crate) wake_suspended: String,
    pub(crate) finish: String,
    /// `finish` of an instance without a parent, returning nothing: one
    /// statement that may commit alone (a child's finish matches no row, as
    /// it must report to its parent in the same transaction). On SQLite a
    /// lone write statement takes the write lock as it starts, and its busy
    /// handler waits for it (also when its snapshot turns out stale), as
    /// `BEGIN IMMEDIATE` does for a transaction.
    pub(crate) finish_alone: String,
    pub(crate) report_child: String,
    pub(crate) wake_parent: String,
    pub(crate) suspend: String,
    pub(crate) status_for_cancel: String,
    pub(crate) status_for_answer: String,
    pub(crate) unfinished_tree: String,
    pub(crate) cancel_one: String,
    pub(crate) status_for_time_out: String,
    pub(crate) count_pending_awakeables: String,
    pub(crate) continue_as_new: String,
    pub(crate) requeue_set_aside: String,
    // Resume worker and executors.
    pub(crate) find_due: String,
    pub(crate) next_wake_at: String,
    pub(crate) claim_due: String,
    pub(crate) find_blocked: String,
    pub(crate) reclaim_own: String,
    pub(crate) record_crash: String,
    pub(crate) get_executor: String,
    pub(crate) list_executors: String,
    pub(crate) insert_executor: String,
    pub(crate) replace_executor: String,
    pub(crate) heartbeat_executor: String,
    pub(crate) delete_executor: String,
    pub(crate) delete_worker_workflows: String,
    pub(crate) insert_worker_workflows: String,
    pub(crate) release_leases_of: String,
    pub(crate) is_served: String,
    pub(crate) delete_worker_queues: String,
    pub(crate) insert_worker_queues: String,
    pub(crate) queue_unserved: String,
    pub(crate) queue_limits_elsewhere: String,
    pub(crate) registered_queue_limits: String,
    // Timers.
    pub(crate) timers_table: String,
    pub(crate) find_text: &'static str,
    pub(crate) schedule_timer: String,
    pub(crate) rearm_timer: String,
    pub(crate) timer_status: String,
    pub(crate) timer_status_and_lease: String,
    pub(crate) cancel_timer: String,
    pub(crate) claim_due_timer: String,
    pub(crate) next_timer_fire_at: String,
    pub(crate) get_timer: String,
    pub(crate) mark_timer_fired: String,
    pub(crate) count_due_timers: String,
    pub(crate) count_stuck_timers: String,
    pub(crate) requeue_stuck_timers: String,
    pub(crate) requeue_timer: String,
    pub(crate) reschedule_timer: String,
    pub(crate) dead_letter_timer: String,
    pub(crate) claim_dead_timer: String,
    pub(crate) renew_timer_resume: String,
    pub(crate) complete_timer_resume: String,
    pub(crate) park_timer_resume: String,
    pub(crate) cancel_timer_resume: String,
    pub(crate) recover_expired_timer_resumes: String,
    // Messages, events and streams.
    pub(crate) talk: crate::messages::TalkStatements,
    // Retry and fork.
    pub(crate) operate: crate::operate::OperateStatements,
    // Retention.
    pub(crate) retention: crate::retention::RetentionStatements,
    // Cron schedules.
    pub(crate) schedules: crate::schedules::ScheduleStatements,
    // Application versions.
    pub(crate) versions: crate::versions::VersionStatements,
    // Queues.
    pub(crate) queue: crate::queue::QueueStatements,
    // Debounce.
    pub(crate) debounce: crate::debounce::DebounceStatements,
}

impl Statements {
    /// Spells every shared statement in `d`'s dialect.
    pub(crate) fn new(d: &Dialect) -> Statements {
        let table = |name: &str| format!("{}{name}", d.tables);
        let (w, s, e) = (table("workflows"), table("steps"), table("executors"));
        let (ww, t) = (table("worker_workflows"), table("timers"));
        let wq = table("worker_queues");
        let child_outcome = child_outcome_sql(d.json_object, d.json_as_text);
        // The due-order indexes the reads in due order name on SQLite (see
        // `Dialect::indexed_by`): every unfinished instance, and those of the
        // default queue. Unnamed, SQLite read every unfinished instance by
        // status and sorted them, for each claim (`suspended_1m` drained
        // 1,000 due instances next to a million sleeping in 6.6 s; 0.2 s
        // off the index).
        let (unfinished_index, default_due_index) =
            (d.index(&w, "unfinished"), d.index(&w, "default_due"));
        // Ends an unfinished instance while its lease is `$3`'s or nobody's
        // (not a queue slot's hold, see `cancel_one`: a retried instance
        // whose cancelled run has not stopped yet is that run's no more).
        let finish = format!(
            "UPDATE {w} SET status = $4, output = $5, error = $6, lease_owner = NULL, \
             lease_expires_at = NULL, wake_at = NULL, updated_at = $7 \
             WHERE id = $1 AND generation = $2 AND {UNFINISHED} \
             AND (lease_owner = $3 OR (lease_owner IS NULL AND lease_expires_at IS NULL))"
        );
        let notify = |write: String| match d.timer_channel {
            // `SELECT` reports its row count, so `rows_affected` still says
            // whether the write (and its notification) happened.
            Some(channel) => format!(
                "WITH written AS ({write} RETURNING id) \
                 SELECT pg_notify('{channel}', '') FROM written"
            ),
            None => write,
        };
        let resume_end = |set: &str| {
            format!(
                "UPDATE {t} SET {set}, updated_at = $5 \
                 WHERE id = $1 AND status = 'resuming' AND resume_token = $2 \
                 AND resume_lease_until > $3 RETURNING {TIMER_COLUMNS}"
            )
        };
        // A child's deadline: the earlier of its own ($12) and its parent's.
        let parent_deadline = format!("(SELECT deadline FROM {w} WHERE id = $7)");
        // The time a suspended instance is due: `at`, or its deadline when
        // that comes first (also when `at` is never).
        let due_by_deadline = |at: &str| {
            format!(
                "CASE WHEN deadline IS NOT NULL AND ({at} IS NULL OR deadline < {at}) \
                 THEN deadline ELSE {at} END"
            )
        };
        Statements {
            insert_instance: format!(
                "INSERT INTO {w} (id, name, generation, status, input, attempts, lease_owner, \
                 lease_expires_at, wake_at, parent_id, parent_seq, parent_generation, \
                 created_at, updated_at, signature, deadline, traceparent, app_version, \
                 skeleton_hash) \
                 VALUES ($1, $2, 0, $3, $4, 0, $5, $6, COALESCE($6, $9), $7, $8, $10, $9, $9, \
                 $11, CASE WHEN {parent_deadline} IS NOT NULL \
                     AND (CAST($12 AS BIGINT) IS NULL OR {parent_deadline} < $12) \
                     THEN {parent_deadline} ELSE $12 END, $13, $14, $15) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            insert_ended: format!(
                "INSERT INTO {w} (id, name, generation, status, input, attempts, created_at, \
                 updated_at, signature, traceparent, app_version, skeleton_hash, output, error) \
                 VALUES ($1, $2, 0, $3, $4, 0, $5, $5, $6, $7, $8, $9, $10, $11) \
                 ON CONFLICT (id) DO NOTHING RETURNING {INSTANCE_COLUMNS}"
            ),
            get_instance: format!("SELECT {INSTANCE_COLUMNS} FROM {w} WHERE id = $1"),
            // Two racing claims on PostgreSQL: the second blocks on the row
            // lock, then re-checks the WHERE clause against the first claim's
            // committed row and finds a live foreign lease.
            // Never an instance on a named queue (only its queue's claim,
            // within the limits, starts it) nor a pending one not due yet (a
            // `.delay`, a debounce, a crash's back-off).
            claim: format!(
                "UPDATE {w} SET lease_owner = $2, lease_expires_at = $3, wake_at = $3, \
                 status = 'running', updated_at = $4 \
                 WHERE id = $1 AND {UNFINISHED} AND queue IS NULL \
                 AND NOT (status = 'pending' AND wake_at > $4) \
                 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < $4) \
                 RETURNING {INSTANCE_COLUMNS}"
            ),
            // A named queue's instance only while its lease is live ($4:
            // now): once it lapsed, a claim may have given its slot away.
            renew_lease: format!(
                "UPDATE {w} SET lease_expires_at = $3, wake_at = $3 \
                 WHERE id = $1 AND lease_owner = $2 AND {UNFINISHED} \
                 AND (queue IS NULL OR lease_expires_at >= $4)"
            ),
            release: format!(
                "UPDATE {w} SET lease_owner = NULL, lease_expires_at = NULL, \
                 wake_at = CASE WHEN {UNFINISHED} THEN $3 ELSE NULL END, updated_at = $3 \
                 WHERE id = $1 AND lease_owner = $2"
            ),
            // A hold is a named-queue row's lease expiry without an owner
            // (see `cancel_one`), freed only by the executor whose run it
            // is ($3: a stale run of another, whose lease lapsed before
            // this one took the instance over, leaves it alone); one put
            // back in line by a retry meanwhile is due now that the slot is
            // free. (A hold kept before `held_by` existed names nobody: any
            // run of the instance frees it, as then.)
            release_ended: format!(
                "UPDATE {w} SET lease_expires_at = NULL, held_by = NULL, \
                 wake_at = CASE WHEN status = 'pending' THEN $2 ELSE wake_at END \
                 WHERE id = $1 AND queue IS NOT NULL AND lease_owner IS NULL \
                 AND lease_expires_at IS NOT NULL AND (held_by = $3 OR held_by IS NULL)"
            ),
            load_journal: format!(
                "SELECT {STEP_COLUMNS} FROM {s} WHERE workflow_id = $1 AND generation = $2 \
                 ORDER BY seq"
            ),
            get_step: format!(
                "SELECT {STEP_COLUMNS} FROM {s} \
                 WHERE workflow_id = $1 AND generation = $2 AND seq = $3"
            ),
            insert_step: format!(
                "INSERT INTO {s} ({STEP_COLUMNS}, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (workflow_id, generation, seq) DO NOTHING"
            ),
            delete_step: format!(
                "DELETE FROM {s} WHERE workflow_id = $1 AND generation = $2 AND seq = $3"
            ),
            step_of_kind_exists: format!(
                "SELECT 1 FROM {s} WHERE workflow_id = $1 AND generation = $2 AND seq = $3 \
                 AND kind = $4"
            ),
            wake_suspended: format!(
                "UPDATE {w} SET wake_at = $3, updated_at = $3 \
                 WHERE id = $1 AND generation = $2 AND status = 'suspended'"
            ),
            finish_alone: format!("{finish} AND parent_id IS NULL"),
            finish: format!("{finish} RETURNING parent_id IS NOT NULL AS has_parent"),
            report_child: format!(
                "INSERT INTO {s} ({STEP_COLUMNS}, created_at) \
                 SELECT parent_id, parent_generation, parent_seq, name, 'child', \
                     {child_outcome}, $2 \
                 FROM {w} WHERE id = $1 AND parent_id IS NOT NULL \
                 AND status <> 'nondeterministic' \
                 ON CONFLICT (workflow_id, generation, seq) DO NOTHING"
            ),
            // Touches the parent's row whenever it is unfinished, not only
            // when suspended: the row lock orders this with a parent that is
            // suspending right now (`Store::suspend` checks the awaited step
            // under that lock), so the child's end is either seen by the
            // suspension or sees the suspended parent and makes it due.
            wake_parent: format!(
                "UPDATE {w} SET wake_at = CASE WHEN status = 'suspended' THEN $2 ELSE wake_at END, \
                 updated_at = $2 WHERE {UNFINISHED} \
                 AND id = (SELECT parent_id FROM {w} WHERE id = $1)"
            ),
            suspend: format!(
                "UPDATE {w} SET status = 'suspended', lease_owner = NULL, \
                 lease_expires_at = NULL, updated_at = $5, waiting_seq = $7, \
                 waiting_kind = $8, waiting_name = $9, wake_at = {} \
                 WHERE id = $1 AND generation = $2 AND lease_owner = $3 AND status = 'running'",
                due_by_deadline(&format!(
                    "(CASE WHEN CAST($6 AS BIGINT) IS NOT NULL AND EXISTS (SELECT 1 FROM {s} \
                     WHERE workflow_id = $1 AND generation = $2 AND seq = $6) \
                     THEN CAST($5 AS BIGINT) ELSE CAST($4 AS BIGINT) END)"
                ))
            ),
            status_for_cancel: format!("SELECT status FROM {w} WHERE id = $1{}", d.lock_row),
            status_for_answer: format!(
                "SELECT status, generation FROM {w} WHERE id = $1{}",
                d.lock_row
            ),
            // `CROSS JOIN` fixes the join order on SQLite (PostgreSQL plans it
            // as any inner join): the tree's few ids first, each looked up by
            // primary key, not every unfinished instance matched to the tree.
            unfinished_tree: format!(
                "WITH RECURSIVE tree(id) AS ( \
                     SELECT CAST($1 AS TEXT) \
                     UNION SELECT w.id FROM {w} w JOIN tree ON w.parent_id = tree.id \
                 ) \
                 SELECT w.id FROM tree CROSS JOIN {w} w WHERE w.id = tree.id AND w.{UNFINISHED}"
            ),
            // A running instance of a named queue keeps its live lease's
            // expiry (not its owner: nobody holds an ended instance; the
            // owner moves to `held_by`, for its worker's count and its
            // run's release): its run, maybe in another process, goes on
            // until it finds out (at once in its own process, at its next
            // renewal elsewhere), and the queue counts it as running until
            // the run lets go (`release_ended`) or the expiry passes. So does
            // one put back in line (`Store::retry`) while such a run still
            // went on, and cancelled again. Only an unfinished instance: a
            // descendant that ended since the tree was read keeps its end.
            cancel_one: format!(
                "UPDATE {w} SET status = $3, error = $4, lease_owner = NULL, \
                 lease_expires_at = CASE WHEN {kept} THEN lease_expires_at END, \
                 held_by = CASE WHEN {kept} THEN COALESCE(lease_owner, held_by) END, \
                 wake_at = NULL, updated_at = $2 WHERE id = $1 AND {UNFINISHED}",
                kept = "queue IS NOT NULL AND status IN ('running', 'pending') \
                        AND lease_expires_at >= $2",
            ),
            status_for_time_out: format!(
                "SELECT status, deadline FROM {w} WHERE id = $1{}",
                d.lock_row
            ),
            // The awakeable step rows first, off their partial index, each
            // instance looked up by primary key (`CROSS JOIN` fixes the order
            // on SQLite, which else read every unfinished instance: this
            // runs at every resume pass).
            count_pending_awakeables: format!(
                "SELECT count(*) FROM {s} a CROSS JOIN {w} w \
                 WHERE w.id = a.workflow_id AND w.generation = a.generation \
                 AND a.kind = 'awakeable' AND w.{UNFINISHED} \
                 AND NOT EXISTS (SELECT 1 FROM {s} r WHERE r.workflow_id = a.workflow_id \
                     AND r.generation = a.generation AND r.seq = a.seq + 1)"
            ),
            continue_as_new: format!(
                "UPDATE {w} SET generation = generation + 1, input = $4, \
                 first_input = COALESCE(first_input, input), status = 'pending', attempts = 0, \
                 debounce_key = NULL, \
                 error = NULL, output = NULL, lease_owner = NULL, lease_expires_at = NULL, \
                 wake_at = $5, updated_at = $5, app_version = COALESCE($6, app_version) \
                 WHERE id = $1 AND generation = $2 AND lease_owner = $3 AND status = 'running'"
            ),
            requeue_set_aside: format!(
                "UPDATE {w} SET status = 'pending', error = NULL, wake_at = $2, updated_at = $2, \
                 debounce_key = NULL WHERE id = $1 AND status = 'nondeterministic'"
            ),
            find_due: format!(
                "SELECT {INSTANCE_COLUMNS} FROM {w}{unfinished_index} \
                 WHERE {UNFINISHED} AND wake_at <= $1 ORDER BY wake_at LIMIT $2"
            ),
            next_wake_at: format!(
                "SELECT MIN(wake_at) FROM {w}{unfinished_index} WHERE {UNFINISHED}"
            ),
            // Registered workflows whose signature matches (or was never
            // recorded), of an accepted version (`$5`, a JSON array) or none.
            // The version test is a filter on the rows the `wake_at` range
            // scan yields, its list read once per statement. On SQLite the
            // statement takes the write lock before it reads; on PostgreSQL
            // `SKIP LOCKED` gives workers claiming at once disjoint batches.
            claim_due: format!(
                "UPDATE {w} SET lease_owner = $1, lease_expires_at = $2, wake_at = $2, \
                 status = 'running', updated_at = $3 \
                 WHERE {} RETURNING {claimed}",
                (d.picked_ids)(&format!(
                    "SELECT id FROM {w}{default_due_index} WHERE {UNFINISHED} \
                     AND wake_at <= $3 AND queue IS NULL \
                     AND (lease_owner IS NULL OR lease_owner = $1 OR lease_expires_at < $3) \
                     AND (app_version IS NULL OR app_version IN ({})) \
                     AND {} ORDER BY wake_at LIMIT $4{}",
                    (d.json_text_elements)("$5"),
                    (d.registered_match)(6),
                    d.skip_locked
                )),
                claimed = claimed_columns(d),
            ),
            find_blocked: {
                let other_version = format!(
                    "w.app_version IS NOT NULL AND w.app_version NOT IN ({})",
                    (d.json_text_elements)("$4")
                );
                format!(
                    "SELECT w.id, w.name, w.signature, r.signature AS registered, \
                     CASE WHEN {other_version} THEN w.app_version END AS other_version \
                     FROM (SELECT * FROM {w}{unfinished_index} \
                         WHERE {UNFINISHED} AND wake_at <= $2 \
                         ORDER BY wake_at LIMIT {BLOCKED_SCAN}) w \
                     LEFT JOIN {} ON r.name = w.name \
                     WHERE (r.name IS NULL OR w.signature <> r.signature OR ({other_version}) \
                          OR (w.lease_owner IS NOT NULL AND w.lease_owner <> $1 \
                              AND w.lease_expires_at >= $2)) \
                     ORDER BY w.wake_at LIMIT $3",
                    (d.registered_rows)(5)
                )
            },
            insert_worker_workflows: format!(
                "INSERT INTO {ww} (executor_id, name) SELECT $1, r.name FROM {}",
                (d.registered_rows)(2)
            ),
            reclaim_own: format!(
                "UPDATE {w} SET wake_at = $2 WHERE lease_owner = $1 AND {UNFINISHED}"
            ),
            record_crash: format!(
                "UPDATE {w} SET attempts = attempts + 1, error = $3, \
                 status = CASE WHEN attempts + 1 >= $4 THEN 'failed' ELSE status END, \
                 wake_at = CASE WHEN attempts + 1 >= $4 THEN NULL ELSE $5 END, \
                 lease_owner = NULL, lease_expires_at = NULL, updated_at = $6 \
                 WHERE id = $1 AND lease_owner = $2 AND {UNFINISHED} \
                 RETURNING status, attempts"
            ),
            get_executor: format!("SELECT {EXECUTOR_COLUMNS} FROM {e} WHERE id = $1"),
            list_executors: format!(
                "SELECT {EXECUTOR_COLUMNS} FROM {e} \
                 WHERE id = $1 OR substr(id, 1, length($2)) = $2 ORDER BY id"
            ),
            insert_executor: format!(
                "INSERT INTO {e} ({EXECUTOR_COLUMNS}) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            replace_executor: format!(
                "UPDATE {e} SET token = $2, host = $3, pid = $4, heartbeat_at = $5 \
                 WHERE id = $1 AND token = $6"
            ),
            heartbeat_executor: format!(
                "UPDATE {e} SET heartbeat_at = $3 WHERE id = $1 AND token = $2"
            ),
            delete_executor: format!("DELETE FROM {e} WHERE id = $1 AND token = $2"),
            delete_worker_workflows: format!("DELETE FROM {ww} WHERE executor_id = $1"),
            release_leases_of: format!(
                "UPDATE {w} SET lease_owner = NULL, lease_expires_at = NULL, wake_at = $2, \
                 updated_at = $2 WHERE lease_owner = $1 AND {UNFINISHED}"
            ),
            delete_worker_queues: format!("DELETE FROM {wq} WHERE executor_id = $1"),
            insert_worker_queues: format!(
                "INSERT INTO {wq} (executor_id, name, limits) SELECT $1, r.name, r.signature \
                 FROM {}",
                (d.registered_rows)(2)
            ),
            registered_queue_limits: format!(
                "SELECT DISTINCT q.name AS queue, q.limits FROM {wq} q \
                 JOIN {e} e ON e.id = q.executor_id AND e.heartbeat_at >= $2 \
                 WHERE q.name <> '' AND q.executor_id <> $1 ORDER BY q.name, q.limits"
            ),
            queue_limits_elsewhere: format!(
                "SELECT o.name AS queue, o.executor_id, o.limits FROM {wq} m \
                 JOIN {wq} o ON o.name = m.name AND o.executor_id <> m.executor_id \
                 AND o.limits <> m.limits \
                 JOIN {e} e ON e.id = o.executor_id AND e.heartbeat_at >= $2 \
                 WHERE m.executor_id = $1 ORDER BY o.name, o.executor_id"
            ),
            // Served by a live worker serving the workflow that declares the
            // queue, or that registered no queue at all (a worker of a
            // version from before queues were registered; every later one
            // registers at least the default queue, '').
            queue_unserved: format!(
                "SELECT w.queue FROM {w} w WHERE w.id = $1 AND w.queue IS NOT NULL \
                 AND NOT EXISTS (SELECT 1 FROM {ww} s JOIN {e} e ON e.id = s.executor_id \
                 WHERE s.name = w.name AND e.heartbeat_at >= $2 \
                 AND (EXISTS (SELECT 1 FROM {wq} q WHERE q.executor_id = s.executor_id \
                 AND q.name = w.queue) \
                 OR NOT EXISTS (SELECT 1 FROM {wq} q WHERE q.executor_id = s.executor_id)))"
            ),
            is_served: format!(
                "SELECT EXISTS (SELECT 1 FROM {ww} w JOIN {e} e ON e.id = w.executor_id \
                 WHERE w.name = $1 AND e.heartbeat_at >= $2) AS served"
            ),
            find_text: d.find_text,
            schedule_timer: notify(format!(
                "INSERT INTO {t} (id, process_manager, correlation_id, fire_at, payload, status, \
                 attempts, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5{json}, 'scheduled', 0, $6, $6) \
                 ON CONFLICT (id) DO NOTHING",
                json = d.json_param
            )),
            rearm_timer: notify(format!(
                "UPDATE {t} SET process_manager = $2, correlation_id = $3, fire_at = $4, \
                 payload = $5{json}, updated_at = $6 WHERE id = $1 AND status = 'scheduled'",
                json = d.json_param
            )),
            timer_status: format!("SELECT status FROM {t} WHERE id = $1"),
            timer_status_and_lease: format!(
                "SELECT status, resume_lease_until FROM {t} WHERE id = $1"
            ),
            cancel_timer: format!(
                "UPDATE {t} SET status = 'cancelled', updated_at = $2 \
                 WHERE id = $1 AND status IN ('scheduled', 'firing', 'dead') \
                 RETURNING {TIMER_COLUMNS}"
            ),
            // On SQLite the statement takes the write lock before it reads;
            // on PostgreSQL a row another claimer locked is skipped, and one
            // it claimed meanwhile fails the re-checked `status`.
            claim_due_timer: format!(
                "UPDATE {t} SET status = 'firing', attempts = attempts + 1, claimed_at = $1, \
                 updated_at = $2 \
                 WHERE id = (SELECT id FROM {t} WHERE status = 'scheduled' AND fire_at <= $1 \
                 ORDER BY fire_at, id LIMIT 1{}) RETURNING {TIMER_COLUMNS}",
                d.skip_locked
            ),
            next_timer_fire_at: format!("SELECT MIN(fire_at) FROM {t} WHERE status = 'scheduled'"),
            get_timer: format!("SELECT {TIMER_COLUMNS} FROM {t} WHERE id = $1"),
            mark_timer_fired: format!(
                "UPDATE {t} SET status = 'fired', event_id = $2, updated_at = $3 \
                 WHERE id = $1 AND status = 'firing' RETURNING {TIMER_COLUMNS}"
            ),
            count_due_timers: format!(
                "SELECT COUNT(*) FROM {t} WHERE status = 'scheduled' AND fire_at <= $1"
            ),
            count_stuck_timers: format!(
                "SELECT COUNT(*) FROM {t} WHERE status = 'firing' AND claimed_at <= $1 \
                 AND ($2 IS NULL OR process_manager = $2)"
            ),
            requeue_stuck_timers: format!(
                "UPDATE {t} SET status = 'scheduled', updated_at = $2 \
                 WHERE status = 'firing' AND claimed_at <= $1"
            ),
            requeue_timer: format!(
                "UPDATE {t} SET status = 'scheduled', \
                 attempts = CASE WHEN status = 'dead' THEN 0 ELSE attempts END, updated_at = $2 \
                 WHERE id = $1 AND status IN ('firing', 'dead') RETURNING {TIMER_COLUMNS}"
            ),
            reschedule_timer: format!(
                "UPDATE {t} SET status = 'scheduled', fire_at = $2, \
                 last_error = COALESCE($3, last_error), updated_at = $4 \
                 WHERE id = $1 AND status IN ('firing', 'scheduled') RETURNING {TIMER_COLUMNS}"
            ),
            dead_letter_timer: format!(
                "UPDATE {t} SET status = 'dead', last_error = $2, updated_at = $3 \
                 WHERE id = $1 AND status IN ('scheduled', 'firing') RETURNING {TIMER_COLUMNS}"
            ),
            claim_dead_timer: format!(
                "UPDATE {t} SET status = 'resuming', resume_token = $2, \
                 resume_lease_until = $3, updated_at = $5 \
                 WHERE id = $1 AND (status = 'dead' \
                 OR (status = 'resuming' AND resume_lease_until <= $4)) RETURNING {TIMER_COLUMNS}"
            ),
            renew_timer_resume: resume_end("resume_lease_until = $4"),
            complete_timer_resume: resume_end(
                "status = 'fired', event_id = $4, resume_token = NULL, resume_lease_until = NULL",
            ),
            park_timer_resume: resume_end(
                "status = 'dead', last_error = COALESCE($4, last_error), resume_token = NULL, \
                 resume_lease_until = NULL",
            ),
            cancel_timer_resume: resume_end(
                "status = 'cancelled', resume_token = NULL, resume_lease_until = NULL, \
                 last_error = COALESCE($4, last_error)",
            ),
            recover_expired_timer_resumes: format!(
                "UPDATE {t} SET status = 'dead', resume_token = NULL, resume_lease_until = NULL, \
                 updated_at = $2 WHERE status = 'resuming' AND resume_lease_until <= $1"
            ),
            timers_table: t,
            talk: crate::messages::TalkStatements::new(d),
            operate: crate::operate::OperateStatements::new(d),
            retention: crate::retention::RetentionStatements::new(d),
            schedules: crate::schedules::ScheduleStatements::new(d),
            versions: crate::versions::VersionStatements::new(d),
            queue: crate::queue::QueueStatements::new(d, &finish),
            debounce: crate::debounce::DebounceStatements::new(d),
        }
    }
}
