//! What an operator asks of a running system: which instances exist in
//! which state (`keiro.list`), and what one of them journaled
//! (`keiro.steps`). Typed, paged, and working on the rows alone: no
//! workflow code needs to be linked.

use std::time::SystemTime;

use keiro_store::{InstanceRow, InstanceStatus, JournalEntry, ListQuery, ListedInstance, Outcome};

use crate::time::{from_us, to_us};
use crate::{Error, Keiro, Result, WorkflowStatus};

/// The most rows one page holds.
pub const MAX_PAGE: u32 = 1000;

/// Which instances [`Keiro::list`] returns. Built from [`Default`] (the 50
/// newest instances of any status) with chained setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ListFilter {
    /// Only these statuses (any when empty).
    pub statuses: Vec<WorkflowStatus>,
    /// Only this workflow name.
    pub name: Option<String>,
    /// Only ids starting with this.
    pub id_prefix: Option<String>,
    /// Only children of this instance.
    pub parent_id: Option<String>,
    /// Created at or after this time.
    pub created_after: Option<SystemTime>,
    /// Created before this time.
    pub created_before: Option<SystemTime>,
    /// Last changed at or after this time.
    pub updated_after: Option<SystemTime>,
    /// Last changed before this time.
    pub updated_before: Option<SystemTime>,
    /// Only instances whose lease this executor holds.
    pub executor: Option<String>,
    /// Only instances of this application version (see
    /// [`Keiro::app_version`](crate::Keiro::app_version)).
    pub version: Option<String>,
    /// Only instances on this queue (a [`queue!`](crate::queue!) name).
    pub queue: Option<String>,
    /// Oldest first (default: newest first).
    pub oldest_first: bool,
    /// Rows per page, 1..=[`MAX_PAGE`] (default 50).
    pub limit: u32,
    /// Where to continue: a previous page's [`Page::next_cursor`].
    pub cursor: Option<String>,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            statuses: Vec::new(),
            name: None,
            id_prefix: None,
            parent_id: None,
            created_after: None,
            created_before: None,
            updated_after: None,
            updated_before: None,
            executor: None,
            version: None,
            queue: None,
            oldest_first: false,
            limit: 50,
            cursor: None,
        }
    }
}

impl ListFilter {
    /// Only instances in `status` (may be called several times).
    pub fn status(mut self, status: WorkflowStatus) -> Self {
        self.statuses.push(status);
        self
    }
    /// Only instances of workflow `name`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Only ids starting with `prefix`.
    pub fn id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.id_prefix = Some(prefix.into());
        self
    }
    /// Only children of `parent`.
    pub fn parent_id(mut self, parent: impl Into<String>) -> Self {
        self.parent_id = Some(parent.into());
        self
    }
    /// Only instances created in `[after, before)` (either bound optional).
    pub fn created(mut self, after: Option<SystemTime>, before: Option<SystemTime>) -> Self {
        self.created_after = after;
        self.created_before = before;
        self
    }
    /// Only instances last changed in `[after, before)`.
    pub fn updated(mut self, after: Option<SystemTime>, before: Option<SystemTime>) -> Self {
        self.updated_after = after;
        self.updated_before = before;
        self
    }
    /// Only instances whose lease `executor` holds.
    pub fn executor(mut self, executor: impl Into<String>) -> Self {
        self.executor = Some(executor.into());
        self
    }
    /// Only instances of application version `version`.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }
    /// Only instances on queue `queue` (a [`queue!`](crate::queue!) name).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }
    /// Oldest first instead of newest first.
    pub fn oldest_first(mut self) -> Self {
        self.oldest_first = true;
        self
    }
    /// Rows per page, 1..=[`MAX_PAGE`].
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
    /// Continue after a previous page.
    pub fn cursor(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The rows, in the listing's order.
    pub items: Vec<T>,
    /// Pass to [`ListFilter::cursor`] for the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// An instance as [`Keiro::list`] shows it.
#[derive(Debug, Clone)]
pub struct WorkflowSummary {
    /// The instance id.
    pub id: String,
    /// The workflow name.
    pub name: String,
    /// Its status.
    pub status: WorkflowStatus,
    /// Crash attempts so far.
    pub attempts: i64,
    /// Its generation (continue-as-new count).
    pub generation: i64,
    /// When it was created.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// Its parent, for a child.
    pub parent_id: Option<String>,
    /// Why it failed, for a failed instance.
    pub error: Option<String>,
    /// The executor holding its lease, while one does.
    pub executor: Option<String>,
    /// When it is next due, if it waits.
    pub wake_at: Option<SystemTime>,
    /// The journal entry it waits on while it is suspended (a sleep, an
    /// awakeable, a child, a message); `None` when it is not suspended. A
    /// running instance that waits in memory (for at most the runtime's
    /// `suspend_after`) shows it once it suspends. Inside a `keiro::select!`
    /// this is the first of the branches' waits.
    pub waiting_on: Option<WaitingOn>,
    /// The W3C `traceparent` of the span that started or enqueued it, when
    /// one was stored (feature `otel`): the trace its runs continue.
    pub traceparent: Option<String>,
    /// The application version it runs under; `None` for an unversioned
    /// instance (created before versions were recorded), which every worker
    /// claims.
    pub version: Option<String>,
    /// The step-call skeleton hash of the code that created it (see
    /// [`crate::binary_hashes`]); `None` when not recorded.
    pub skeleton_hash: Option<String>,
    /// The queue it was enqueued on ([`WorkflowCall::queue`](crate::WorkflowCall::queue));
    /// `None`: the default queue.
    pub queue: Option<String>,
    /// The key of the debounced burst that enqueued it
    /// ([`WorkflowCall::debounce`](crate::WorkflowCall::debounce)); `None`
    /// when it was not debounced, or was retried, requeued or continued as
    /// new since (it then takes no more of the burst's calls).
    pub debounce_key: Option<String>,
}

/// What a suspended instance waits on ([`WorkflowSummary::waiting_on`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingOn {
    /// The seq of the journal entry that ends the wait (a sleep's entry holds
    /// its deadline already; the others are recorded when the wait ends).
    pub seq: i64,
    /// What kind of wait.
    pub kind: WaitKind,
    /// The sleep's name (`sleep`, or `timeout deadline` for a deadline), the
    /// child's workflow name, the message topic, or `awakeable`.
    pub name: String,
}

/// The kinds of wait [`WaitingOn`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitKind {
    /// `keiro::sleep` / `sleep_until`, or a timeout's deadline.
    Sleep,
    /// An awakeable's answer (named so that it does not share the name of
    /// [`crate::Awakeable`], which would make rustc spell that type with its
    /// path in diagnostics).
    AwakeableAnswer,
    /// A child workflow's end.
    Child,
    /// A message (`keiro::recv`).
    Message,
}

impl WaitKind {
    /// How the kind is stored (and printed): `sleep`, `awakeable`, `child`,
    /// `message`.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Sleep => "sleep",
            WaitKind::AwakeableAnswer => "awakeable",
            WaitKind::Child => "child",
            WaitKind::Message => "message",
        }
    }

    fn parse(stored: &str) -> Option<WaitKind> {
        [
            WaitKind::Sleep,
            WaitKind::AwakeableAnswer,
            WaitKind::Child,
            WaitKind::Message,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == stored)
    }
}

impl std::fmt::Display for WaitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl WorkflowSummary {
    /// The summary of a row as a listing reads it.
    pub(crate) fn of(listed: &ListedInstance) -> WorkflowSummary {
        let row = &listed.row;
        let waiting_on = listed.waiting.as_ref().and_then(|waiting| {
            Some(WaitingOn {
                seq: waiting.seq,
                kind: WaitKind::parse(&waiting.kind)?,
                name: waiting.name.clone(),
            })
        });
        WorkflowSummary {
            id: row.id.clone(),
            name: row.name.clone(),
            status: WorkflowStatus::of(row),
            attempts: row.attempts,
            generation: row.generation,
            created_at: from_us(row.created_at),
            updated_at: from_us(row.updated_at),
            parent_id: row.parent_id.clone(),
            error: row.error.clone(),
            executor: row.lease_owner.clone(),
            wake_at: row.wake_at.map(from_us),
            waiting_on,
            traceparent: row.traceparent.clone(),
            version: row.app_version.clone(),
            skeleton_hash: row.skeleton_hash.clone(),
            queue: listed.queue.clone(),
            debounce_key: listed.debounce_key.clone(),
        }
    }
}

/// How a journal entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// A value (a step's `Ok`, or a value that is not a `Result`).
    Ok,
    /// A step's `Err`, a rejection or a failure.
    Err,
}

/// One journal entry ([`Keiro::steps`]).
#[derive(Debug, Clone)]
pub struct StepRecord {
    /// Its sequence number in the run.
    pub seq: i64,
    /// What kind of entry: `step`, `sleep`, `awakeable`, `resolution`,
    /// `child`, `recv`, `send`, `set_event`, `write_stream`, `now`, `uuid`,
    /// `patch` (a [`crate::patched`] marker), ….
    pub kind: String,
    /// The step's name (a topic or key for messages, events and streams).
    pub name: String,
    /// Whether it ended in a value or an error.
    pub outcome: StepOutcome,
    /// The stored value, as JSON.
    pub value: serde_json::Value,
    /// How many times a `#[step]`'s body ran to reach this result, retries
    /// included; `None` for entries that run no body (sleeps, answers,
    /// children, messages) and for entries older than keiro keeping it.
    pub attempts: Option<u32>,
    /// When a `#[step]`'s first attempt began (`None` as for `attempts`).
    pub started_at: Option<SystemTime>,
    /// When the entry was recorded.
    pub finished_at: SystemTime,
}

impl StepRecord {
    fn of(entry: &JournalEntry) -> StepRecord {
        let row = &entry.row;
        let stored: serde_json::Value =
            serde_json::from_str(&row.result).unwrap_or(serde_json::Value::Null);
        // `Result`s (a step's, a child's, an answer) are stored as
        // `{"Ok":…}` / `{"Err":…}`; any other value as itself.
        let (outcome, value) = match Outcome::decode(&row.result) {
            Some(Outcome::Err(value)) => (StepOutcome::Err, value),
            Some(Outcome::Ok(value)) => (StepOutcome::Ok, value),
            None => (StepOutcome::Ok, stored),
        };
        StepRecord {
            seq: row.seq,
            kind: row.kind.clone(),
            name: row.name.clone(),
            outcome,
            value,
            attempts: entry.attempts,
            started_at: entry.started_at.map(from_us),
            finished_at: from_us(entry.recorded_at),
        }
    }
}

/// The cursor of the page after `row`, in a listing of `order`.
fn cursor_after(row: &InstanceRow, oldest_first: bool) -> String {
    let order = if oldest_first { 'o' } else { 'n' };
    let id: String = row.id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{order}{}.{id}", row.created_at)
}

/// Reads a cursor made by [`cursor_after`] for a listing of `oldest_first`.
fn parse_cursor(cursor: &str, oldest_first: bool) -> Result<(i64, String)> {
    let invalid = |reason: &str| Error::InvalidCursor {
        cursor: cursor.chars().take(80).collect(),
        reason: reason.to_owned(),
    };
    let mut chars = cursor.chars();
    let order = chars.next().ok_or_else(|| invalid("it is empty"))?;
    let expected = if oldest_first { 'o' } else { 'n' };
    if order != expected && matches!(order, 'o' | 'n') {
        return Err(invalid(
            "it continues a listing in the other order; list in the same order as the page it \
             came from",
        ));
    }
    let rest = chars.as_str();
    let (created, id) = rest
        .split_once('.')
        .filter(|_| matches!(order, 'o' | 'n'))
        .ok_or_else(|| invalid("it is not a cursor keiro made; pass a page's next_cursor as is"))?;
    let created: i64 = created
        .parse()
        .map_err(|_| invalid("its time is not a number"))?;
    if id.len() % 2 != 0 {
        return Err(invalid("its id is cut short"));
    }
    let bytes: std::result::Result<Vec<u8>, _> = (0..id.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&id[i..i + 2], 16))
        .collect();
    let id = bytes
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| invalid("its id is not hex-encoded UTF-8"))?;
    Ok((created, id))
}

fn store_status(status: &WorkflowStatus) -> InstanceStatus {
    match status {
        WorkflowStatus::Pending => InstanceStatus::Pending,
        WorkflowStatus::Running => InstanceStatus::Running,
        WorkflowStatus::Suspended => InstanceStatus::Suspended,
        WorkflowStatus::Completed => InstanceStatus::Completed,
        WorkflowStatus::Failed => InstanceStatus::Failed,
        WorkflowStatus::Cancelled => InstanceStatus::Cancelled,
        WorkflowStatus::TimedOut => InstanceStatus::TimedOut,
        _ => InstanceStatus::NonDeterministic,
    }
}

impl Keiro {
    /// One page of the instances `filter` selects, newest first unless it
    /// says otherwise. Pages are keyset pages on (creation time, id): each
    /// costs the same wherever it starts, and following `next_cursor`
    /// visits every matching instance once, even while instances are added.
    /// A cursor that is malformed, or from a listing in the other order, is
    /// [`Error::InvalidCursor`]; a limit outside 1..=1000
    /// [`Error::InvalidOption`].
    pub async fn list(&self, filter: &ListFilter) -> Result<Page<WorkflowSummary>> {
        if filter.limit == 0 || filter.limit > MAX_PAGE {
            return Err(Error::invalid_option(
                "ListFilter::limit",
                format!("{} rows per page; use 1..={MAX_PAGE}", filter.limit),
            ));
        }
        let after = filter
            .cursor
            .as_deref()
            .map(|c| parse_cursor(c, filter.oldest_first))
            .transpose()?;
        let statuses: Vec<InstanceStatus> = filter.statuses.iter().map(store_status).collect();
        let query = ListQuery {
            statuses: &statuses,
            name: filter.name.as_deref(),
            id_prefix: filter.id_prefix.as_deref(),
            parent_id: filter.parent_id.as_deref(),
            created_after: filter.created_after.map(to_us),
            created_before: filter.created_before.map(to_us),
            updated_after: filter.updated_after.map(to_us),
            updated_before: filter.updated_before.map(to_us),
            executor: filter.executor.as_deref(),
            app_version: filter.version.as_deref(),
            queue: filter.queue.as_deref(),
            oldest_first: filter.oldest_first,
            after: after.as_ref().map(|(created, id)| (*created, id.as_str())),
            // One more than asked tells whether another page follows.
            limit: i64::from(filter.limit) + 1,
        };
        let mut rows = self.raw_store().list_summaries(&query).await?;
        let more = rows.len() > filter.limit as usize;
        rows.truncate(filter.limit as usize);
        let next_cursor = more
            .then(|| {
                rows.last()
                    .map(|listed| cursor_after(&listed.row, filter.oldest_first))
            })
            .flatten();
        Ok(Page {
            items: rows.iter().map(WorkflowSummary::of).collect(),
            next_cursor,
        })
    }

    /// Instance `id`'s summary, as [`Keiro::list`] shows it (with what it
    /// waits on). An unknown id is [`Error::NotFound`].
    pub async fn summary(&self, id: &str) -> Result<WorkflowSummary> {
        Error::check_id("workflow id", id)?;
        let listed = self
            .raw_store()
            .get_summary(id)
            .await?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        Ok(WorkflowSummary::of(&listed))
    }

    /// Every journal entry of instance `id`'s current generation, in order.
    /// An unknown id is [`Error::NotFound`].
    pub async fn steps(&self, id: &str) -> Result<Vec<StepRecord>> {
        let row = self
            .raw_store()
            .get_instance(id)
            .await?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        self.steps_of(id, row.generation).await
    }

    /// Every journal entry of generation `generation` of instance `id`.
    pub async fn steps_of(&self, id: &str, generation: i64) -> Result<Vec<StepRecord>> {
        Error::check_id("workflow id", id)?;
        let rows = self
            .raw_store()
            .load_journal_entries(id, generation)
            .await?;
        Ok(rows.iter().map(StepRecord::of).collect())
    }
}

/// [`Keiro::list`] on the process-wide runtime.
pub async fn list(filter: &ListFilter) -> Result<Page<WorkflowSummary>> {
    crate::runtime::global().await?.list(filter).await
}
