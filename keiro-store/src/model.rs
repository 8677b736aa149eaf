//! What the store reads and writes: rows, requests and outcomes of the journal,
//! the resume worker and durable timers.

/// Where a workflow instance stands, as stored in its row's `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InstanceStatus {
    /// Recorded, waiting for an executor to claim it.
    Pending,
    /// Claimed by an executor (or crashed while claimed).
    Running,
    /// Waiting on a timer, awakeable or child; costs only its row.
    Suspended,
    /// Finished with an output.
    Completed,
    /// Finished with an error output, or failed after its crash attempts.
    Failed,
    /// Cancelled by request.
    Cancelled,
    /// Set aside because the code no longer matches its journal.
    NonDeterministic,
    /// Ended at its deadline (or an ancestor's) before it finished.
    TimedOut,
}

impl InstanceStatus {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStatus::Pending => "pending",
            InstanceStatus::Running => "running",
            InstanceStatus::Suspended => "suspended",
            InstanceStatus::Completed => "completed",
            InstanceStatus::Failed => "failed",
            InstanceStatus::Cancelled => "cancelled",
            InstanceStatus::NonDeterministic => "nondeterministic",
            InstanceStatus::TimedOut => "timed_out",
        }
    }

    /// Parses the `status` column.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => InstanceStatus::Pending,
            "running" => InstanceStatus::Running,
            "suspended" => InstanceStatus::Suspended,
            "completed" => InstanceStatus::Completed,
            "failed" => InstanceStatus::Failed,
            "cancelled" => InstanceStatus::Cancelled,
            "nondeterministic" => InstanceStatus::NonDeterministic,
            "timed_out" => InstanceStatus::TimedOut,
            _ => return None,
        })
    }

    /// Whether the instance will never run again on its own
    /// (completed, failed, cancelled, timed out, or set aside).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            InstanceStatus::Completed
                | InstanceStatus::Failed
                | InstanceStatus::Cancelled
                | InstanceStatus::NonDeterministic
                | InstanceStatus::TimedOut
        )
    }
}

/// A request to record a new workflow instance.
#[derive(Debug, Clone)]
pub struct NewInstance<'a> {
    /// The instance id chosen by the caller.
    pub id: &'a str,
    /// The registered workflow name.
    pub name: &'a str,
    /// The JSON-encoded arguments.
    pub input: &'a str,
    /// The workflow's signature (its argument and return types), so workers
    /// whose workflow of this name has other types leave the instance alone.
    /// `None` matches any.
    pub signature: Option<&'a str>,
    /// The parent awaiting this instance, for a child workflow.
    pub parent: Option<ParentLink<'a>>,
    /// Claim the new row for this executor right away (`status = running`),
    /// or leave it `pending` for any worker when `None`.
    pub lease: Option<Lease<'a>>,
    /// When it times out (µs since the Unix epoch): it and its unfinished
    /// descendants then end as [`InstanceStatus::TimedOut`]. A child's stored
    /// deadline is the earlier of this and its parent's. Fixed at creation:
    /// creating an existing id keeps the stored one.
    pub deadline: Option<i64>,
    /// The W3C `traceparent` of the span that started or enqueued it, so its
    /// runs continue that trace wherever they happen. Stored as given (keiro
    /// checks it when it reads it back); fixed at creation like `deadline`.
    pub traceparent: Option<&'a str>,
    /// The application version of the creating process: only workers of that
    /// version (or declaring it compatible) claim the instance. `None` leaves
    /// it unversioned, claimable by every worker.
    pub app_version: Option<&'a str>,
    /// The step-call skeleton hash of the workflow code that created it, for
    /// the pre-deploy check. `None` when unknown.
    pub skeleton_hash: Option<&'a str>,
}

impl<'a> NewInstance<'a> {
    /// Instance `id` of workflow `name` with arguments `input` (JSON), and
    /// nothing else: no signature, parent, lease, deadline, trace, version
    /// or skeleton hash, so it is recorded `pending` for any worker. Set
    /// the rest with struct update syntax (`NewInstance { lease, ..new }`).
    pub fn new(id: &'a str, name: &'a str, input: &'a str) -> NewInstance<'a> {
        NewInstance {
            id,
            name,
            input,
            signature: None,
            parent: None,
            lease: None,
            deadline: None,
            traceparent: None,
            app_version: None,
            skeleton_hash: None,
        }
    }
}

/// Where a child workflow reports its end: the parent step it fills.
#[derive(Debug, Clone, Copy)]
pub struct ParentLink<'a> {
    /// The parent instance id.
    pub id: &'a str,
    /// The parent generation that awaits the child.
    pub generation: i64,
    /// The parent's step sequence number for the child.
    pub seq: i64,
}

/// What happened to a resolution handed to [`crate::Store::resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The resolution was recorded and the waiter made due.
    Recorded,
    /// The step was resolved before; the first resolution stands.
    AlreadyResolved(StepRow),
    /// No such awaitable was created (wrong id, or its workflow is gone).
    Unknown,
    /// The instance has ended (completed, failed or cancelled): nobody will
    /// read a resolution, so none was recorded.
    Finished(InstanceStatus),
    /// The awaitable's generation has ended: the instance continued as new
    /// and now runs this generation. None was recorded.
    Continued(i64),
}

/// What [`crate::Store::cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancellation {
    /// These instances (the target first, then its unfinished descendants)
    /// are now cancelled.
    Cancelled(Vec<String>),
    /// The instance had already ended with this status; nothing changed.
    AlreadyFinal(InstanceStatus),
    /// No instance has this id.
    NotFound,
}

/// An executor's claim on an instance.
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// The executor identity holding the lease.
    pub owner: &'a str,
    /// How long the lease lasts without renewal, in microseconds.
    pub ttl_us: i64,
}

/// A stored workflow instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRow {
    /// The instance id.
    pub id: String,
    /// The registered workflow name.
    pub name: String,
    /// The generation (bumped by continue-as-new); steps are keyed by it.
    pub generation: i64,
    /// Where it stands.
    pub status: InstanceStatus,
    /// The JSON-encoded arguments of the current generation.
    pub input: String,
    /// The generation-0 arguments, kept once continue-as-new replaced
    /// `input`; `None` while `input` still holds them. See
    /// [`InstanceRow::original_input`].
    pub first_input: Option<String>,
    /// The workflow's signature when created (its argument and return types);
    /// `None` for rows from before signatures were recorded, matching any.
    pub signature: Option<String>,
    /// The JSON-encoded return value once finished.
    pub output: Option<String>,
    /// A diagnostic for failed or set-aside instances.
    pub error: Option<String>,
    /// Crash attempts counted so far.
    pub attempts: i64,
    /// The executor holding the lease, if any.
    pub lease_owner: Option<String>,
    /// When the lease lapses (µs since the Unix epoch).
    pub lease_expires_at: Option<i64>,
    /// When a suspended instance is due (µs since the Unix epoch).
    pub wake_at: Option<i64>,
    /// The parent instance, for a child workflow.
    pub parent_id: Option<String>,
    /// The parent's step sequence number that awaits this child.
    pub parent_seq: Option<i64>,
    /// When it times out (µs since the Unix epoch), if ever.
    pub deadline: Option<i64>,
    /// The W3C `traceparent` of the span that started or enqueued it, if
    /// one was recorded ([`NewInstance::traceparent`]).
    pub traceparent: Option<String>,
    /// The application version it runs under ([`NewInstance::app_version`]);
    /// `None` for an unversioned instance (created before versions were
    /// recorded), which every worker may claim.
    pub app_version: Option<String>,
    /// The step-call skeleton hash of the code that created it
    /// ([`NewInstance::skeleton_hash`]), if recorded.
    pub skeleton_hash: Option<String>,
    /// When the row was created (µs since the Unix epoch).
    pub created_at: i64,
    /// When the row last changed (µs since the Unix epoch).
    pub updated_at: i64,
    /// `true` when the claim that returned this row also saw no journal row
    /// of its current generation, so the run it starts need not read the
    /// journal; `false` when that is not known (every read but a claim's).
    pub fresh: bool,
}

impl InstanceRow {
    /// The arguments the instance was started with (generation 0), whatever
    /// continue-as-new did since.
    pub fn original_input(&self) -> &str {
        self.first_input.as_deref().unwrap_or(&self.input)
    }
}

/// One recorded step result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRow {
    /// The workflow instance.
    pub workflow_id: String,
    /// The instance generation the step belongs to.
    pub generation: i64,
    /// The step's sequence number in the run, allocated when it was called.
    pub seq: i64,
    /// The step's name.
    pub name: String,
    /// What kind of step (`step`, `now`, `uuid`, `sleep`, `awakeable`, `child`).
    pub kind: String,
    /// The JSON-encoded result.
    pub result: String,
}

/// What happened to one step row handed to [`crate::Store::append_steps`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendOutcome {
    /// The row was recorded.
    Inserted,
    /// Another writer recorded this step id first; its row is returned and wins.
    Existing(StepRow),
}

/// How a finished run leaves its instance.
#[derive(Debug, Clone, Copy)]
pub struct Finish<'a> {
    /// The instance id.
    pub id: &'a str,
    /// The generation that finished.
    pub generation: i64,
    /// The executor finishing it; the update applies only while it holds the lease
    /// (or nobody does).
    pub owner: &'a str,
    /// The final status.
    pub status: InstanceStatus,
    /// The JSON-encoded output, if any.
    pub output: Option<&'a str>,
    /// A diagnostic, if any.
    pub error: Option<&'a str>,
}

/// A running instance put to rest until it is due again
/// ([`Store::suspend`](crate::Store::suspend)).
#[derive(Debug, Clone, Copy)]
pub struct Suspend<'a> {
    /// The instance id.
    pub id: &'a str,
    /// The generation that suspends.
    pub generation: i64,
    /// The executor suspending it; applies only while it holds the lease.
    pub owner: &'a str,
    /// When it is due by time (µs since the Unix epoch); `None`: never by time.
    pub wake_at: Option<i64>,
    /// The step (an awakeable or a child) it waits on, if any: when that step
    /// is already recorded, the instance is due at once.
    pub awaiting: Option<i64>,
    /// What it waits on, as operators see it ([`crate::ListedInstance`]);
    /// stored with the suspension, `None` when nothing can be named.
    pub waiting: Option<&'a crate::WaitingStep>,
}

/// The end of one generation and the start of the next
/// ([`Store::continue_as_new`](crate::Store::continue_as_new)).
#[derive(Debug, Clone, Copy)]
pub struct ContinueAsNew<'a> {
    /// The instance id.
    pub id: &'a str,
    /// The generation that ends.
    pub generation: i64,
    /// The executor ending it; applies only while it holds the lease.
    pub owner: &'a str,
    /// The JSON-encoded input of the next generation.
    pub input: &'a str,
    /// The application version of the process continuing it, recorded for
    /// the next generation; `None` keeps the stored one.
    pub app_version: Option<&'a str>,
}

/// A crash (panic) of a run, counted against the instance's attempts.
#[derive(Debug, Clone, Copy)]
pub struct Crash<'a> {
    /// The instance id.
    pub id: &'a str,
    /// The executor whose run crashed; applies only while it holds the lease.
    pub owner: &'a str,
    /// The panic message, stored as the instance's error.
    pub error: &'a str,
    /// At this many attempts the instance is marked failed.
    pub max_attempts: i64,
    /// When to try again if attempts remain (µs since the Unix epoch).
    pub retry_at: i64,
}

/// A registered executor identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorRow {
    /// The identity (`KEIRO_EXECUTOR_ID`).
    pub id: String,
    /// A random token naming the process holding the identity now.
    pub token: String,
    /// The host name of that process.
    pub host: String,
    /// Its process id.
    pub pid: i64,
    /// Its last heartbeat (µs since the Unix epoch).
    pub heartbeat_at: i64,
}

/// A workflow a worker can run: its name and signature. Claims take only
/// instances of one of these whose signature is the same (or unrecorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered<'a> {
    /// The registered workflow name.
    pub name: &'a str,
    /// The signature of the workflow registered under it.
    pub signature: &'a str,
}

/// A due instance a worker cannot claim, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The instance id.
    pub id: String,
    /// Its workflow name.
    pub name: String,
    /// Why the worker cannot claim it.
    pub reason: BlockReason,
}

/// Why a due instance is [`Blocked`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockReason {
    /// The worker registers no workflow of this name.
    UnknownName,
    /// The worker registers a workflow of this name with another signature.
    SignatureMismatch {
        /// The signature recorded with the instance.
        stored: String,
        /// The signature the worker registers.
        registered: String,
    },
    /// Another executor holds a live lease on it.
    Leased,
    /// It runs under an application version the worker neither has nor
    /// declares compatible.
    OtherVersion {
        /// The instance's version.
        version: String,
    },
}

impl BlockReason {
    /// Classifies a blocked row from its stored signature and the signature
    /// registered under its name (`None`: the name is not registered).
    /// `other_version` is its version when the worker does not accept it.
    pub(crate) fn of(
        stored: Option<String>,
        registered: Option<String>,
        other_version: Option<String>,
    ) -> BlockReason {
        match (stored, registered, other_version) {
            (_, None, _) => BlockReason::UnknownName,
            (Some(stored), Some(registered), _) if stored != registered => {
                BlockReason::SignatureMismatch { stored, registered }
            }
            (_, _, Some(version)) => BlockReason::OtherVersion { version },
            _ => BlockReason::Leased,
        }
    }
}

/// Microseconds since the Unix epoch, the store's unit of time (every time
/// column holds it since migration 0008).
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Timers

/// Where a timer stands, as stored in its row's `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimerStatus {
    /// Waiting for its fire time; a worker claims it once due.
    Scheduled,
    /// Claimed by a worker whose fire action is running (or crashed while
    /// running: a stale claim is requeued after the worker's timeout).
    Firing,
    /// Fired: the action completed and recorded the event it produced.
    Fired,
    /// Dead-lettered: it failed permanently or hit the attempt ceiling.
    /// It stays here, with its reason, until an operator requeues, resumes or
    /// cancels it.
    Dead,
    /// Cancelled before it fired.
    Cancelled,
    /// A dead timer held by a guarded foreground resume claim.
    Resuming,
}

impl TimerStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [TimerStatus; 6] = [
        TimerStatus::Scheduled,
        TimerStatus::Firing,
        TimerStatus::Fired,
        TimerStatus::Dead,
        TimerStatus::Cancelled,
        TimerStatus::Resuming,
    ];

    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            TimerStatus::Scheduled => "scheduled",
            TimerStatus::Firing => "firing",
            TimerStatus::Fired => "fired",
            TimerStatus::Dead => "dead",
            TimerStatus::Cancelled => "cancelled",
            TimerStatus::Resuming => "resuming",
        }
    }

    /// Parses the `status` column.
    pub fn parse(text: &str) -> Option<TimerStatus> {
        TimerStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether the timer is done for good (fired or cancelled).
    pub fn is_final(self) -> bool {
        matches!(self, TimerStatus::Fired | TimerStatus::Cancelled)
    }
}

impl std::fmt::Display for TimerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A timer to schedule.
#[derive(Debug, Clone, Copy)]
pub struct NewTimer<'a> {
    /// The timer's id, chosen by the caller; scheduling is idempotent on it.
    pub id: &'a str,
    /// The process manager (or other owner) the timer belongs to. Workers
    /// route on it, and it labels metrics, so keep the set of names bounded.
    pub process_manager: &'a str,
    /// What the timer is about (a saga, an order, a session): free text.
    pub correlation_id: &'a str,
    /// When it is due (µs since the Unix epoch).
    pub fire_at: i64,
    /// JSON text handed to the fire action. The store refuses text that is not JSON.
    pub payload: &'a str,
}

/// A stored timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerRow {
    /// The timer's id.
    pub id: String,
    /// The process manager it belongs to.
    pub process_manager: String,
    /// What it is about.
    pub correlation_id: String,
    /// When it is due (µs since the Unix epoch).
    pub fire_at: i64,
    /// The JSON payload, as text.
    pub payload: String,
    /// Where it stands.
    pub status: TimerStatus,
    /// How many times a worker has claimed it.
    pub attempts: i64,
    /// The latest diagnostic: a retry note, a dead-letter reason.
    pub last_error: Option<String>,
    /// The event its firing produced, once fired.
    pub event_id: Option<String>,
    /// When the current (or last) worker claim was taken (µs since the Unix epoch).
    pub claimed_at: Option<i64>,
    /// While `resuming`: when the foreground claim lapses (µs since the Unix epoch).
    pub resume_lease_until: Option<i64>,
    /// When the row was created (µs since the Unix epoch).
    pub created_at: i64,
    /// When the row last changed (µs since the Unix epoch).
    pub updated_at: i64,
}

/// What [`crate::Store::schedule_timer`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// A new timer was recorded.
    Created,
    /// A scheduled timer with this id was re-armed with the new fire time and payload.
    Updated,
    /// A timer with this id exists and is past `scheduled` (firing, fired, dead,
    /// cancelled, resuming); it was left as it is.
    Unchanged(TimerStatus),
}

/// What an id-only timer mutation did.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerUpdate {
    /// It applied; the row as it is now.
    Applied(TimerRow),
    /// No timer has this id.
    Missing,
    /// The timer's status does not allow it; nothing changed.
    NotApplicable(TimerStatus),
    /// A guarded foreground resume claim holds the timer (until the given µs
    /// since the Unix epoch); only its holder may move it. Nothing changed.
    Guarded {
        /// When the claim lapses unless renewed.
        lease_until: i64,
    },
}

impl TimerUpdate {
    /// Whether the mutation applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, TimerUpdate::Applied(_))
    }
}

/// What [`crate::Store::claim_dead_timer`] did.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeClaimOutcome {
    /// The timer is now `resuming`, held by the given token.
    Claimed(TimerRow),
    /// No timer has this id.
    Missing,
    /// The timer is not dead; nothing changed.
    NotDead(TimerStatus),
    /// Another foreground claim holds it until the given µs since the Unix epoch.
    Held {
        /// When that claim lapses unless renewed.
        lease_until: i64,
    },
}

/// What a token-guarded resume operation did.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeUpdate {
    /// It applied; the row as it is now.
    Applied(TimerRow),
    /// The token no longer holds the timer: the lease lapsed, another claim took
    /// it, or it was never this token's. Carries the timer's status now (`None`
    /// when the timer is gone). Nothing changed.
    Lost(Option<TimerStatus>),
}

/// Which timers [`crate::Store::find_timers`] lists, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerListKind {
    /// `scheduled` timers, by `(fire_at, id)`.
    Pending {
        /// Only timers due at or before this time, when set.
        due_by: Option<i64>,
    },
    /// `firing` timers claimed at or before `claimed_by`, by `(claimed_at, id)`.
    Stuck {
        /// The newest claim time counted as stuck.
        claimed_by: i64,
    },
    /// `dead` timers, by `(updated_at, id)`: the order they were dead-lettered.
    Dead,
}

/// How a timer's `last_error` must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonMatch<'a> {
    /// Exactly this text.
    Exact(&'a str),
    /// Containing this text (case-sensitive).
    Contains(&'a str),
}

/// One page of [`crate::Store::find_timers`]: a keyset page, stable under concurrent
/// inserts (each row's position depends only on its own key).
#[derive(Debug, Clone, Copy)]
pub struct TimerQuery<'a> {
    /// Which timers.
    pub kind: TimerListKind,
    /// Only this process manager's, when set.
    pub process_manager: Option<&'a str>,
    /// Only those whose `last_error` matches, when set.
    pub reason: Option<ReasonMatch<'a>>,
    /// Only rows after this `(sort key, id)`: the last row of the previous page.
    pub after: Option<(i64, &'a str)>,
    /// At most this many rows.
    pub limit: i64,
}

/// The sort key of `record` in a listing of `kind`: the first half of the
/// keyset `(key, id)`.
pub fn timer_sort_key(kind: TimerListKind, record: &TimerRow) -> i64 {
    match kind {
        TimerListKind::Pending { .. } => record.fire_at,
        TimerListKind::Stuck { .. } => record.claimed_at.unwrap_or(0),
        TimerListKind::Dead => record.updated_at,
    }
}

/// How a token-guarded resume operation moves a `resuming` timer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ResumeEnd<'a> {
    Renew { lease_until: i64 },
    Complete { event_id: &'a str },
    Park { reason: Option<&'a str> },
    Cancel,
}
