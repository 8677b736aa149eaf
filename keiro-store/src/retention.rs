//! Retention: deleting what finished long ago, one short transaction at a
//! time.
//!
//! [`Store::gc_batch`] runs one batch and says where the next starts
//! ([`GcCursor`]); the caller loops (the runtime's `Keiro::gc`, which on
//! SQLite sends each batch through the [`crate::JournalWriter`] so batches
//! take turns with the workflows' writes). A run walks three kinds of rows in
//! keyset order, so rows it keeps are never scanned twice:
//!
//! 1. finished root instances older than their cutoff, each deleted with its
//!    whole tree of descendants (journals, messages, events, stream entries)
//!    only when every instance of the tree is finished;
//! 2. journal rows of generations below an instance's current one (and the
//!    messages those generations consumed) older than the finished cutoff,
//!    whatever the instance's status;
//! 3. fired and cancelled process-manager timers older than the finished
//!    cutoff.
//!
//! A dry run runs the very same batches and rolls each back, so it counts
//! exactly what a real run then deletes.

use std::collections::{BTreeSet, HashMap};

use crate::query::Arg;
use crate::sql::Dialect;
use crate::{Conn, Result, Store, StoreError};

/// The most ids bound to one statement (SQLite allows 32,766 parameters,
/// PostgreSQL 65,535).
const IDS_PER_STATEMENT: usize = 500;

/// How many roots' trees a batch reads first; then as many as it has room
/// for, until it has more instances than its size.
const TREES_PER_READ: usize = 32;

/// The finished statuses of an instance, each with the cutoff it is aged by.
const ROOT_STATUSES: [&str; 4] = ["completed", "timed_out", "failed", "cancelled"];

/// The finished statuses of a timer.
const TIMER_STATUSES: [&str; 2] = ["fired", "cancelled"];

/// The statements of [`Store::gc_batch`]. The status of a scan is spelled
/// into its text, beside the partial index's own condition where it has
/// one, so that SQLite (which matches a partial index's `WHERE` term by
/// term) uses it.
#[derive(Debug)]
pub(crate) struct RetentionStatements {
    /// Per [`ROOT_STATUSES`] entry: one page of root instances of that
    /// status last changed before `$1`, after `($2, $3)` in `(created_at,
    /// id)` order, at most `$4`: id, creation time and generation. It scans
    /// the `(status, created_at, id)` index listing keeps (migration 0012),
    /// bounded by the cutoff as an instance changes after it is created; an
    /// index of its own would cost every finishing instance an index write.
    roots: [String; 4],
    /// Instances with older generations, after id `$1`, at most `$2`.
    continued: String,
    /// Per [`TIMER_STATUSES`] entry: one page of timers of that status
    /// changed before `$1`, after `($2, $3)`, at most `$4`.
    timers: [String; 2],
    /// The table names, for the statements built per batch (their `IN`
    /// lists vary in length).
    workflows: String,
    steps: String,
    messages: String,
    events: String,
    streams: String,
    timers_table: String,
    /// Locks the rows a batch is about to delete (PostgreSQL `FOR UPDATE`;
    /// SQLite's `BEGIN IMMEDIATE` holds the whole database already).
    lock_row: &'static str,
}

impl RetentionStatements {
    pub(crate) fn new(d: &Dialect) -> RetentionStatements {
        let table = |name: &str| format!("{}{name}", d.tables);
        let (w, t) = (table("workflows"), table("timers"));
        let roots = ROOT_STATUSES.map(|status| {
            format!(
                "SELECT id, created_at, generation FROM {w} \
                 WHERE status = '{status}' AND created_at < $1 \
                 AND (created_at, id) > ($2, $3) \
                 AND parent_id IS NULL AND updated_at < $1 \
                 ORDER BY created_at, id LIMIT $4"
            )
        });
        let timers = TIMER_STATUSES.map(|status| {
            format!(
                "SELECT id, updated_at FROM {t} \
                 WHERE status IN ('fired', 'cancelled') \
                 AND status = '{status}' AND updated_at < $1 \
                 AND (updated_at, id) > ($2, $3) \
                 ORDER BY updated_at, id LIMIT $4"
            )
        });
        RetentionStatements {
            roots,
            continued: format!(
                "SELECT id FROM {w} WHERE generation > 0 AND id > $1 ORDER BY id LIMIT $2"
            ),
            timers,
            workflows: w,
            steps: table("steps"),
            messages: table("messages"),
            events: table("events"),
            streams: table("streams"),
            timers_table: t,
            lock_row: d.lock_row,
        }
    }

    /// The children of the instances bound from `$1`: id, parent id, status,
    /// generation and last change. One level at a time rather than one recursive query:
    /// each level is a plain probe of the parent index, whatever the
    /// planner's statistics say, and most trees are a lone root.
    fn children(&self, parents: usize) -> String {
        format!(
            "SELECT id, parent_id, status, generation, updated_at FROM {} \
             WHERE parent_id IS NOT NULL AND parent_id IN ({})",
            self.workflows,
            placeholders(1, parents)
        )
    }

    /// The status and last change of the instances bound from `$1`, their
    /// rows locked.
    fn lock(&self, ids: usize) -> String {
        format!(
            "SELECT id, status, updated_at FROM {} WHERE id IN ({}) ORDER BY id{}",
            self.workflows,
            placeholders(1, ids),
            self.lock_row
        )
    }

    /// Deletes the timers bound from `$1` that are still fired or cancelled
    /// (PostgreSQL re-checks the status of a row changed since the scan).
    fn delete_timers(&self, ids: usize) -> String {
        format!(
            "DELETE FROM {} WHERE status IN ('fired', 'cancelled') AND id IN ({})",
            self.timers_table,
            placeholders(1, ids)
        )
    }

    /// Deletes the journal rows of generations below the current one of the
    /// instances bound from `$2`, created before `$1`.
    fn delete_old_steps(&self, ids: usize) -> String {
        let (s, w) = (&self.steps, &self.workflows);
        format!(
            "DELETE FROM {s} WHERE workflow_id IN ({}) AND created_at < $1 \
             AND generation < (SELECT w.generation FROM {w} w WHERE w.id = {s}.workflow_id)",
            placeholders(2, ids)
        )
    }

    /// Deletes the messages consumed by generations below the current one of
    /// the instances bound from `$2`, consumed before `$1`.
    fn delete_old_messages(&self, ids: usize) -> String {
        let (m, w) = (&self.messages, &self.workflows);
        format!(
            "DELETE FROM {m} WHERE workflow_id IN ({}) AND consumed_at < $1 \
             AND consumed_generation < \
                 (SELECT w.generation FROM {w} w WHERE w.id = {m}.workflow_id)",
            placeholders(2, ids)
        )
    }
}

/// Deletes the rows of `table` whose `column` is one of the `ids` ids bound
/// from `$1`.
fn delete_of(table: &str, column: &str, ids: usize) -> String {
    format!(
        "DELETE FROM {table} WHERE {column} IN ({})",
        placeholders(1, ids)
    )
}

/// `$from, $from+1, …`, `n` placeholders.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|k| format!("${k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one gc run deletes: instances finished before these times (µs since
/// the Unix epoch), in batches of this size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    /// Completed and timed-out root instances last changed before this go;
    /// so do journal rows of old generations and finished timers.
    pub finished_before: i64,
    /// Failed and cancelled root instances last changed before this go.
    pub failed_before: i64,
    /// At most this many instances (roots with their whole trees; a single
    /// tree larger than this goes alone), instances with old generations, or
    /// timers per batch.
    pub batch_size: i64,
    /// Count, then roll every batch back.
    pub dry_run: bool,
}

impl GcPolicy {
    /// The cutoff of root instances of `status` (one of [`ROOT_STATUSES`]).
    fn cutoff(&self, status: &str) -> i64 {
        match status {
            "failed" | "cancelled" => self.failed_before,
            _ => self.finished_before,
        }
    }
}

/// Where the next batch of a gc run starts. A run starts at
/// [`GcCursor::default`] and goes on while [`GcProgress::next`] is `Some`.
#[derive(Debug, Clone, Default)]
pub struct GcCursor {
    phase: Phase,
    /// The last `(created_at, id)` (roots), `(updated_at, id)` (timers) or id (old generations)
    /// of the phase scanned so far.
    after: Option<(i64, String)>,
    /// In a dry run: the instances with old generations that an earlier
    /// batch would have deleted with their tree, so the old-generation scan
    /// does not count their rows a second time.
    doomed_continued: BTreeSet<String>,
}

/// Which rows a batch scans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    /// Root instances of [`ROOT_STATUSES`]`[i]`.
    #[default]
    Roots0,
    Roots1,
    Roots2,
    Roots3,
    /// Instances with older generations.
    Continued,
    /// Timers of [`TIMER_STATUSES`]`[i]`.
    Timers0,
    Timers1,
}

impl Phase {
    fn next(self) -> Option<Phase> {
        Some(match self {
            Phase::Roots0 => Phase::Roots1,
            Phase::Roots1 => Phase::Roots2,
            Phase::Roots2 => Phase::Roots3,
            Phase::Roots3 => Phase::Continued,
            Phase::Continued => Phase::Timers0,
            Phase::Timers0 => Phase::Timers1,
            Phase::Timers1 => return None,
        })
    }
}

/// What a gc run deleted (or, in a dry run, would delete); one batch's share
/// in [`GcProgress::summary`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GcSummary {
    /// Instances: finished roots and all their descendants.
    pub instances: u64,
    /// Journal rows of those instances (every generation).
    pub steps: u64,
    /// Messages addressed to those instances, and messages consumed by old
    /// generations of instances that stay.
    pub messages: u64,
    /// Events of those instances.
    pub events: u64,
    /// Stream entries of those instances.
    pub stream_entries: u64,
    /// Fired and cancelled process-manager timers.
    pub timers: u64,
    /// Journal rows of old generations of instances that stay.
    pub old_generation_steps: u64,
    /// Transactions run.
    pub batches: u64,
}

impl GcSummary {
    /// Whether nothing was (or would be) deleted.
    pub fn is_empty(&self) -> bool {
        GcSummary {
            batches: self.batches,
            ..GcSummary::default()
        } == *self
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &GcSummary) {
        self.instances += other.instances;
        self.steps += other.steps;
        self.messages += other.messages;
        self.events += other.events;
        self.stream_entries += other.stream_entries;
        self.timers += other.timers;
        self.old_generation_steps += other.old_generation_steps;
        self.batches += other.batches;
    }
}

/// What [`Store::gc_batch`] did.
#[derive(Debug, Clone)]
pub struct GcProgress {
    /// What it deleted, in one batch.
    pub summary: GcSummary,
    /// Where the next batch starts; `None` when the run is done.
    pub next: Option<GcCursor>,
    /// How long the batch's transaction took.
    pub took: std::time::Duration,
}

/// One batch's work order: the policy and where to start. Owned, so it can be
/// handed to the writer task.
#[derive(Debug, Clone)]
pub struct GcRequest {
    /// What goes.
    pub policy: GcPolicy,
    /// Where this batch starts.
    pub cursor: GcCursor,
}

/// Reads every row of `$text` with `$args` bound, as `$row`s, on a [`Conn`].
macro_rules! fetch_as {
    ($conn:expr, $row:ty, $text:expr, $args:expr) => {
        dispatch!(Conn, &mut *$conn, |c| bind_all!(
            crate::prepared::query_as::<_, $row>($text),
            $args
        )
        .fetch_all(&mut **c)
        .await
        .map_err(StoreError::query(OP)))
    };
}

/// The name gc's store errors carry.
const OP: &str = "gc";

/// Runs `text` with `leading` then every id of `ids` bound, in chunks of
/// [`IDS_PER_STATEMENT`] ids (`text` builds the statement for a chunk's
/// length); returns the rows it changed.
async fn execute_for_ids(
    conn: &mut Conn<'_>,
    text: impl Fn(usize) -> String,
    leading: &[Arg<'_>],
    ids: &[&str],
) -> Result<u64> {
    let mut changed = 0;
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let text = text(chunk.len());
        let args: Vec<Arg<'_>> = leading
            .iter()
            .copied()
            .chain(chunk.iter().map(|id| Arg::Text(id)))
            .collect();
        changed += dispatch!(Conn, &mut *conn, |c| bind_all!(
            crate::prepared::query(&text),
            &args
        )
        .execute(&mut **c)
        .await
        .map(|done| done.rows_affected())
        .map_err(StoreError::query(OP)))?;
    }
    Ok(changed)
}

/// One instance of a tree: its root, id, whether it may go (see
/// [`may_go`]) and generation.
type Member = (String, String, bool, i64);

/// Whether an instance `status` is final.
fn is_finished(status: &str) -> bool {
    ROOT_STATUSES.contains(&status)
}

/// Whether an instance of a tree may go with it: finished, and last changed
/// before its status's cutoff. A child that ended recently keeps its old
/// root's tree: its start may still count in a queue's rate window (which
/// the retention is checked to cover), and it is gone no sooner than a
/// root that ended when it did.
fn may_go(policy: &GcPolicy, status: &str, updated_at: i64) -> bool {
    is_finished(status) && updated_at < policy.cutoff(status)
}

/// The instances of the trees whose every instance may go, each with its
/// root.
fn doomed_trees(members: &[Member]) -> HashMap<String, String> {
    let unfinished: BTreeSet<&str> = members
        .iter()
        .filter(|(_, _, goes, _)| !goes)
        .map(|(root, ..)| root.as_str())
        .collect();
    members
        .iter()
        .filter(|(root, ..)| !unfinished.contains(root.as_str()))
        .map(|(root, id, ..)| (id.clone(), root.clone()))
        .collect()
}

impl Store {
    /// Runs one batch of a gc run in one transaction: the next page of the
    /// cursor's phase (moving on while a phase has nothing left), deleted,
    /// or counted and rolled back when `policy.dry_run`.
    pub async fn gc_batch(&self, request: GcRequest) -> Result<GcProgress> {
        let GcRequest { policy, mut cursor } = request;
        let started = std::time::Instant::now();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let mut conn: Conn<'_> = (&mut *tx).into();
            let (mut summary, more) = loop {
                let (counts, full) =
                    batch_on(&mut conn, &sql.retention, &policy, &mut cursor).await?;
                if full {
                    break (counts, true);
                }
                // This phase is done: the next starts from its beginning.
                cursor.after = None;
                match cursor.phase.next() {
                    Some(phase) => cursor.phase = phase,
                    None => break (counts, false),
                }
                if !counts.is_empty() {
                    break (counts, true);
                }
            };
            if policy.dry_run {
                tx.rollback().await.map_err(StoreError::query(OP))?;
            } else {
                tx.commit().await.map_err(StoreError::query(OP))?;
            }
            summary.batches = 1;
            Ok(GcProgress {
                summary,
                next: more.then_some(cursor),
                took: started.elapsed(),
            })
        })
    }
}

/// Runs one page of `cursor`'s phase on `conn` and moves the cursor past it;
/// returns what it deleted and whether the page was full (more may follow).
async fn batch_on(
    conn: &mut Conn<'_>,
    r: &RetentionStatements,
    policy: &GcPolicy,
    cursor: &mut GcCursor,
) -> Result<(GcSummary, bool)> {
    let limit = policy.batch_size.max(1);
    let (at, after_id) = cursor.after.clone().unwrap_or((i64::MIN, String::new()));
    let mut counts = GcSummary::default();
    match cursor.phase {
        phase @ (Phase::Roots0 | Phase::Roots1 | Phase::Roots2 | Phase::Roots3) => {
            let i = phase as usize;
            let cutoff = policy.cutoff(ROOT_STATUSES[i]);
            let page = fetch_as!(
                conn,
                (String, i64, i64),
                &r.roots[i],
                &args![cutoff, at, after_id.as_str(), limit]
            )?;
            // A batch holds trees whole, and at most `limit` instances unless
            // its first tree alone is larger: the rest of the page waits for
            // the next batch. Trees are read a few roots first, so a page of
            // large trees is not read whole to delete its first few.
            let scanned_all = page.len() as i64 >= limit;
            let mut members = Vec::new();
            let mut read = 0;
            while read < page.len() && (members.len() as i64) <= limit {
                // A first few roots, then as many as the batch has room
                // for if their trees were lone roots: two reads for a page
                // of small trees.
                let room = usize::try_from(limit)
                    .unwrap_or(0)
                    .saturating_sub(members.len());
                let take = room.max(TREES_PER_READ).min(page.len() - read);
                let take = if read == 0 {
                    take.min(TREES_PER_READ)
                } else {
                    take
                };
                members.extend(trees(conn, r, policy, &page[read..read + take]).await?);
                read += take;
            }
            let (page, members, cut) = fitting(page, members, limit);
            let mut doomed = doomed_trees(&members);
            if !r.lock_row.is_empty() && !doomed.is_empty() {
                lock_doomed(conn, r, policy, &mut doomed).await?;
            }
            if policy.dry_run {
                cursor.doomed_continued.extend(
                    members
                        .iter()
                        .filter(|(_, id, _, generation)| *generation > 0 && doomed.contains_key(id))
                        .map(|(_, id, ..)| id.clone()),
                );
            }
            let ids: Vec<&str> = doomed.keys().map(String::as_str).collect();
            let delete = |table: &str, column: &'static str| {
                let table = table.to_owned();
                move |n: usize| delete_of(&table, column, n)
            };
            counts.steps =
                execute_for_ids(conn, delete(&r.steps, "workflow_id"), &[], &ids).await?;
            counts.messages =
                execute_for_ids(conn, delete(&r.messages, "workflow_id"), &[], &ids).await?;
            counts.events =
                execute_for_ids(conn, delete(&r.events, "workflow_id"), &[], &ids).await?;
            counts.stream_entries =
                execute_for_ids(conn, delete(&r.streams, "workflow_id"), &[], &ids).await?;
            // The instances last: a tree's rows above went while its
            // instances still named them.
            counts.instances = execute_for_ids(conn, delete(&r.workflows, "id"), &[], &ids).await?;
            if let Some((id, at, _)) = page.last() {
                cursor.after = Some((*at, id.clone()));
            }
            Ok((counts, scanned_all || cut))
        }
        Phase::Continued => {
            let page = fetch_as!(
                conn,
                (String,),
                &r.continued,
                &args![after_id.as_str(), limit]
            )?;
            let ids: Vec<&str> = page
                .iter()
                .map(|(id,)| id.as_str())
                .filter(|id| !cursor.doomed_continued.contains(*id))
                .collect();
            let cutoff = [Arg::Int(policy.finished_before)];
            counts.old_generation_steps =
                execute_for_ids(conn, |n| r.delete_old_steps(n), &cutoff, &ids).await?;
            counts.messages =
                execute_for_ids(conn, |n| r.delete_old_messages(n), &cutoff, &ids).await?;
            if let Some((id,)) = page.last() {
                cursor.after = Some((0, id.clone()));
            }
            Ok((counts, page.len() as i64 >= limit))
        }
        phase @ (Phase::Timers0 | Phase::Timers1) => {
            let i = phase as usize - Phase::Timers0 as usize;
            let page = fetch_as!(
                conn,
                (String, i64),
                &r.timers[i],
                &args![policy.finished_before, at, after_id.as_str(), limit]
            )?;
            let ids: Vec<&str> = page.iter().map(|(id, _)| id.as_str()).collect();
            counts.timers = execute_for_ids(conn, |n| r.delete_timers(n), &[], &ids).await?;
            if let Some((id, at)) = page.last() {
                cursor.after = Some((*at, id.clone()));
            }
            Ok((counts, page.len() as i64 >= limit))
        }
    }
}

/// The first roots of `page` whose trees (read into `members`) hold at most
/// `limit` instances in all (at least the first root, however large its
/// tree; never a root whose tree was not read), with those trees' members,
/// and whether any root was left for a later batch.
fn fitting(
    mut page: Vec<(String, i64, i64)>,
    members: Vec<Member>,
    limit: i64,
) -> (Vec<(String, i64, i64)>, Vec<Member>, bool) {
    let mut sizes: HashMap<&str, i64> = HashMap::new();
    for (root, ..) in &members {
        *sizes.entry(root.as_str()).or_default() += 1;
    }
    let (mut kept, mut total) = (0, 0);
    for (root, ..) in &page {
        // Every read root has a member: itself.
        let Some(&size) = sizes.get(root.as_str()) else {
            break;
        };
        if kept > 0 && total + size > limit {
            break;
        }
        (kept, total) = (kept + 1, total + size);
    }
    if kept == page.len() {
        return (page, members, false);
    }
    page.truncate(kept);
    let roots: BTreeSet<&str> = page.iter().map(|(id, ..)| id.as_str()).collect();
    let members = members
        .into_iter()
        .filter(|(root, ..)| roots.contains(root.as_str()))
        .collect();
    (page, members, true)
}

/// Every instance of the trees under `roots` (id, creation time,
/// generation; each may go, as the page read them), level by level.
async fn trees(
    conn: &mut Conn<'_>,
    r: &RetentionStatements,
    policy: &GcPolicy,
    roots: &[(String, i64, i64)],
) -> Result<Vec<Member>> {
    let mut members: Vec<Member> = roots
        .iter()
        .map(|(id, _, generation)| (id.clone(), id.clone(), true, *generation))
        .collect();
    // The last level found: each instance's id and its root.
    let mut level: HashMap<String, String> = roots
        .iter()
        .map(|(id, ..)| (id.clone(), id.clone()))
        .collect();
    while !level.is_empty() {
        let parents: Vec<&str> = level.keys().map(String::as_str).collect();
        let mut next = HashMap::new();
        for chunk in parents.chunks(IDS_PER_STATEMENT) {
            let args: Vec<Arg<'_>> = chunk.iter().map(|id| Arg::Text(id)).collect();
            let text = r.children(chunk.len());
            for (id, parent, status, generation, updated_at) in
                fetch_as!(conn, (String, String, String, i64, i64), &text, &args)?
            {
                let root = level[&parent].clone();
                let goes = may_go(policy, &status, updated_at);
                members.push((root.clone(), id.clone(), goes, generation));
                next.insert(id, root);
            }
        }
        level = next;
    }
    Ok(members)
}

/// Locks the rows of `doomed` (PostgreSQL), then drops every tree in which
/// an instance is gone or no longer finished: a retry that committed since
/// the scan made it runnable again.
async fn lock_doomed(
    conn: &mut Conn<'_>,
    r: &RetentionStatements,
    policy: &GcPolicy,
    doomed: &mut HashMap<String, String>,
) -> Result<()> {
    let mut ids: Vec<String> = doomed.keys().cloned().collect();
    ids.sort_unstable();
    let mut spoiled: BTreeSet<String> = BTreeSet::new();
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let args: Vec<Arg<'_>> = chunk.iter().map(|id| Arg::Text(id)).collect();
        let text = r.lock(chunk.len());
        let rows = fetch_as!(conn, (String, String, i64), &text, &args)?;
        let finished: BTreeSet<&str> = rows
            .iter()
            .filter(|(_, status, updated_at)| may_go(policy, status, *updated_at))
            .map(|(id, ..)| id.as_str())
            .collect();
        spoiled.extend(
            chunk
                .iter()
                .filter(|id| !finished.contains(id.as_str()))
                .filter_map(|id| doomed.get(id).cloned()),
        );
    }
    doomed.retain(|_, root| !spoiled.contains(root));
    Ok(())
}
