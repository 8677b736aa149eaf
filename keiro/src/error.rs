//! keiro's one error type.

use std::sync::Arc;

pub use keiro_store::StoreError;

/// A `Result` whose error defaults to [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong running a workflow, said so a user can act on it.
///
/// Cheap to clone: sources sit behind `Arc`, so one failure can be handed to
/// every caller waiting on the same workflow.
///
/// Its `Debug` output is the same sentence as its `Display` (so a `main`
/// returning `Result<(), keiro::Error>` prints what to do, not a struct dump),
/// followed by the chain of sources.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store could not be reached or a statement failed. Retryable when
    /// [`Error::is_transient`] says so.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No workflow instance has this id.
    #[error("no workflow instance has id `{id}`")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// The id is already used by an instance of another workflow, or by
    /// an instance that is not the child this call makes: a child's identity
    /// includes its parent link, so an instance started outside any workflow
    /// (or as another parent's child) is not a parent's child of that id,
    /// and an outside call with other arguments is not the child's call.
    #[error(
        "workflow id `{id}` is already used by workflow `{existing}`{held_as}; \
         it cannot also start workflow `{requested}`{requested_as} (choose another id)"
    )]
    IdConflict {
        /// The contested id.
        id: String,
        /// The workflow the id belongs to.
        existing: String,
        /// The workflow that asked for it.
        requested: String,
        /// How the existing instance was started, when that is the conflict
        /// (e.g. ` started outside any workflow`); empty otherwise.
        held_as: String,
        /// How this call wanted it, when that is the conflict (e.g. ` as the
        /// child at step 0 of workflow instance `P``); empty otherwise.
        requested_as: String,
    },
    /// The id names an instance started with other arguments. A workflow id
    /// names one call; [`crate::handle`] reads the stored result whatever
    /// the arguments were.
    #[error(
        "workflow `{name}` id `{id}` already exists with different arguments; a workflow id \
         names one call: use a new id, or `keiro::handle(id)` to get the stored result"
    )]
    InputMismatch {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
    },
    /// The id names an instance of a workflow of this name whose argument or
    /// return types differ from this one's: another binary's workflow of the
    /// same name, or this one before its types changed.
    #[error(
        "workflow `{name}` id `{id}` was started by a workflow `{name}` with other types \
         (`{stored}`, here `{requested}`): another binary's workflow of that name, or this \
         one before its types changed; use a new id, or rename one of the workflows"
    )]
    SignatureMismatch {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The signature recorded with the instance.
        stored: String,
        /// The signature of the workflow called here.
        requested: String,
    },
    /// The workflow was cancelled.
    #[error("workflow `{name}` (id {id}) was cancelled")]
    Cancelled {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
    },
    /// The workflow reached its deadline (`call.timeout(..)` /
    /// `call.deadline(..)`, its own or an ancestor's) before it finished; it
    /// and its unfinished descendants ended as
    /// [`WorkflowStatus::TimedOut`](crate::WorkflowStatus::TimedOut).
    #[error(
        "workflow `{name}` (id {id}) timed out at its deadline ({} s after the Unix epoch) \
         before it finished; start it with a later `.timeout(..)` / `.deadline(..)`, or none",
        .deadline.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    )]
    TimedOut {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// When it timed out.
        deadline: std::time::SystemTime,
    },
    /// A child workflow could not produce a result.
    #[error("child workflow `{name}` (id {id}) of workflow {parent_id} failed: {source}")]
    ChildFailed {
        /// The child's workflow name.
        name: String,
        /// The child's instance id.
        id: String,
        /// The parent's instance id.
        parent_id: String,
        /// Why the child failed.
        #[source]
        source: Arc<Error>,
    },
    /// The code no longer matches the journal. The instance is set aside with its
    /// journal untouched; fix the code and call [`crate::Keiro::resume`].
    #[error(
        "non-determinism in workflow `{name}` (id {id}) at step {seq}: the journal \
         recorded {expected} but the code now calls {found}; the instance is set aside \
         with its journal untouched (fix the code, then resume it)"
    )]
    NonDeterministic {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The step sequence number where code and journal disagree.
        seq: i64,
        /// What the journal recorded there, e.g. ``step `reserve` ``.
        expected: String,
        /// What the code called there.
        found: String,
    },
    /// A stored instance names a workflow this binary does not register.
    #[error(
        "workflow `{name}` (id {id}) is registered nowhere in this binary (was it renamed \
         or removed? if a crate this binary never names defines it, add \
         `keiro::link!(that_crate)` to main.rs)"
    )]
    UnknownWorkflow {
        /// The stored workflow name.
        name: String,
        /// The instance id.
        id: String,
    },
    /// An instance is due but no live resume worker serves its workflow name,
    /// and none has for a while. Nothing was changed: the instance stays
    /// pending and runs once a worker that registers the name starts.
    #[error(
        "workflow `{name}` (id {id}) is waiting for a worker, but no live keiro resume \
         worker has registered `{name}` for {waited:?}; start a worker whose binary links \
         the crate defining it (`keiro::link!(that_crate)` in the worker's main.rs; its log \
         lists the workflows it serves at start). The instance stays pending and runs \
         once such a worker starts"
    )]
    NoWorker {
        /// The workflow name no worker serves.
        name: String,
        /// The instance id.
        id: String,
        /// How long the caller waited for a worker to serve it.
        waited: std::time::Duration,
    },
    /// An instance waits on a queue that no live resume worker claims from:
    /// the workers serving its workflow link no `keiro::queue!` of that
    /// name (it was declared in a module of another binary only).
    #[error(
        "no live resume worker claims from queue `{queue}` (waited {waited:?} for instance \
         `{id}` of workflow `{name}`): the workers serving the workflow do not declare the \
         queue; link the module with its `keiro::queue!` into the worker binary (each worker \
         logs the queues it claims from at start). The instance stays pending and runs once \
         such a worker starts"
    )]
    NoQueueWorker {
        /// The queue no worker claims from.
        queue: String,
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// How long the caller waited.
        waited: std::time::Duration,
    },
    /// Two functions registered the same workflow name.
    #[error(
        "workflow name `{name}` is registered twice, by `{first}` and by `{second}`; \
         rename one with #[workflow(name = \"...\")]"
    )]
    DuplicateWorkflow {
        /// The contested name.
        name: String,
        /// One function registering it.
        first: String,
        /// The other function registering it.
        second: String,
    },
    /// Stored JSON does not decode into the type the code now expects
    /// (typically a type changed between deploys). Nothing was changed.
    #[error("cannot decode {what}: {source} (nothing in the journal was changed)")]
    Decode {
        /// What was being decoded, naming the workflow, id and step.
        what: String,
        /// The JSON error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A value could not be encoded as JSON for the journal.
    #[error("cannot encode {what} as JSON: {source}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// The JSON error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// The workflow (or one of its steps) panicked.
    #[error("workflow `{name}` (id {id}) panicked: {message}")]
    Panicked {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// The panic message.
        message: String,
    },
    /// The workflow was marked failed by the runtime (e.g. after its crash attempts).
    #[error("workflow `{name}` (id {id}) failed: {message}")]
    Failed {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// Why.
        message: String,
    },
    /// No awakeable has this id (malformed, or its workflow never created it).
    #[error("no awakeable has id `{id}`")]
    UnknownAwakeable {
        /// The id given.
        id: String,
    },
    /// An awakeable was answered with a value of another type than the one
    /// its workflow awaits. Nothing was recorded.
    #[error("awakeable `{id}` awaits a `{expected}`, not a `{found}`; nothing was recorded")]
    AwakeableTypeMismatch {
        /// The awakeable id.
        id: String,
        /// The type the workflow awaits.
        expected: String,
        /// The type it was answered with.
        found: String,
    },
    /// An awakeable was answered with a value of the awaited type that does
    /// not decode back into it (e.g. a value its `Deserialize` refuses).
    /// Nothing was recorded: the awakeable still takes a valid answer.
    #[error(
        "the answer to awakeable `{id}` (a `{found}`) does not decode into the awaited \
         `{expected}`: {message}; nothing was recorded, answer with a valid value"
    )]
    AwakeableAnswerInvalid {
        /// The awakeable id.
        id: String,
        /// The type the workflow awaits.
        expected: String,
        /// The type it was answered with.
        found: String,
        /// Why it does not decode.
        message: String,
    },
    /// An awakeable of a workflow instance that has ended (completed, failed
    /// or cancelled), or of a generation it has continued past, was answered:
    /// nobody will read the answer.
    #[error(
        "awakeable `{id}` belongs to workflow instance `{workflow_id}`, which is {status}: \
         nobody awaits the answer; nothing was recorded"
    )]
    AwakeableWorkflowFinished {
        /// The awakeable id.
        id: String,
        /// The workflow instance that created it.
        workflow_id: String,
        /// How the instance ended (`completed`, `failed`, `cancelled`), or
        /// that it continued as new past the awakeable's generation.
        status: String,
    },
    /// The awakeable was answered before; the first answer stands.
    #[error("awakeable `{id}` was already answered; the first answer stands")]
    AlreadyResolved {
        /// The awakeable id.
        id: String,
    },
    /// The awakeable was rejected.
    #[error("awakeable `{id}` was rejected: {reason}")]
    Rejected {
        /// The awakeable id.
        id: String,
        /// The reason given by the rejecting side.
        reason: String,
    },
    /// Another live process holds this executor identity.
    #[error(
        "executor identity `{id}` is in use by live process {pid} on host `{host}`; \
         give each worker process its own KEIRO_EXECUTOR_ID"
    )]
    ExecutorIdInUse {
        /// The contested identity.
        id: String,
        /// The host of the process holding it.
        host: String,
        /// Its process id.
        pid: i64,
    },
    /// This process's clock is further from the database server's than
    /// [`crate::KeiroBuilder::max_clock_skew`] allows (PostgreSQL): it takes no
    /// executor identity, and a running worker claims nothing, until its
    /// clock is back.
    #[error(
        "this process's clock (executor `{executor}`) is {} the database server's, more than \
         max_clock_skew ({limit:?}) allows: workers compare lease and wake times by their own \
         clocks, so a worker whose clock is off takes live instances' leases, or has its own \
         taken, and steps run twice; synchronise this host's clock (NTP), or raise lease_ttl \
         and max_clock_skew together",
        clock_offset_words(*.offset_ms)
    )]
    ClockSkew {
        /// The executor identity the process takes or holds.
        executor: String,
        /// This process's clock minus the server's, in ms: positive when it
        /// runs ahead.
        offset_ms: i64,
        /// The limit it is beyond.
        limit: std::time::Duration,
    },
    /// The run was stopped by a clean shutdown of this process
    /// ([`crate::Keiro::shutdown`], [`crate::ResumeWorker::shutdown`]). Its
    /// lease was released with its journal, status and attempts untouched, so
    /// another worker resumes it at once.
    #[error(
        "workflow `{name}` (id {id}) was stopped by a clean shutdown of this process; \
         its lease was released and any resume worker continues it from its journal"
    )]
    Stopped {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
    },
    /// This runtime was shut down ([`crate::Keiro::shutdown`]) and no longer
    /// runs workflows; reading, enqueuing, cancelling and answering still work.
    #[error(
        "this keiro runtime (executor `{executor}`) was shut down and runs no more \
         workflows; connect a new one (Keiro::connect) to run them in this process"
    )]
    ShutDown {
        /// The executor identity the runtime held.
        executor: String,
    },
    /// A timer operation failed or was refused.
    #[error(transparent)]
    Timer(#[from] crate::timers::TimerError),
    /// No schedule has this name.
    #[error("no schedule is named `{name}` (schedules: {known})")]
    UnknownSchedule {
        /// The name asked for.
        name: String,
        /// The names of the stored schedules (the first 20 and how many more), or `none`.
        known: String,
    },
    /// A schedule's definition or the change asked of it is refused: a
    /// malformed cron expression or time zone, a taken name.
    #[error("schedule `{name}` is refused: {reason}")]
    InvalidSchedule {
        /// The schedule.
        name: String,
        /// What is wrong and what to do instead.
        reason: String,
    },
    /// An enqueue with a dedup key that an unfinished instance of the same
    /// queue holds; once that one finishes, the key is free again.
    #[error(
        "queue `{queue}` already holds unfinished instance `{existing_id}` with dedup key \
         `{key}`; wait for it to finish or use another key"
    )]
    Duplicate {
        /// The queue.
        queue: String,
        /// The dedup key.
        key: String,
        /// The unfinished instance holding the key.
        existing_id: String,
    },
    /// A builder or options setting is out of range (checked before anything
    /// connects or starts).
    #[error("invalid keiro option `{option}`: {reason}")]
    InvalidOption {
        /// The setting, e.g. `lease_ttl` or `ResumeOptions::concurrency`.
        option: &'static str,
        /// What is wrong with its value and what to use instead.
        reason: String,
    },
    /// A call that works only inside a `#[workflow]` was made outside one.
    #[error("{op} works only inside a #[workflow]; {instead}")]
    NotInWorkflow {
        /// The call, e.g. `keiro::spawn(resize)`.
        op: String,
        /// What to do outside a workflow.
        instead: &'static str,
    },
    /// [`crate::Keiro::resume`] was asked for an instance that is not set
    /// aside for non-determinism, so there is nothing to put back in line.
    #[error(
        "workflow `{name}` (id {id}) is {status}, not set aside for non-determinism; \
         there is nothing to resume"
    )]
    NotSetAside {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// Its status, e.g. `completed`.
        status: String,
    },
    /// [`crate::Keiro::retry`] was asked for an instance that is not failed
    /// after its crash attempts nor cancelled, or for a child whose parent
    /// recorded its result already; nothing changed.
    #[error(
        "workflow `{name}` (id {id}) is {status} and cannot be retried: {}",
        crate::error::retry_hint(status)
    )]
    NotRetryable {
        /// The workflow name.
        name: String,
        /// The instance id.
        id: String,
        /// Its status, e.g. `running` or `completed`.
        status: String,
    },
    /// A workflow was given an empty instance id.
    #[error(
        "workflow `{name}` was given an empty id; give it a non-empty one, or none for a \
         fresh UUID"
    )]
    EmptyId {
        /// The workflow name.
        name: String,
    },
    /// An id, name or key given to keiro was refused before anything was
    /// written: empty, holding a NUL byte, or longer than
    /// [`crate::MAX_ID_BYTES`].
    #[error("invalid {what} `{value_preview}`: {reason}")]
    InvalidId {
        /// Which value, e.g. `workflow id`, `child id`, `awakeable id`.
        what: &'static str,
        /// The value's start, escaped (a NUL shows as `\0`), with its length
        /// when cut, so a huge id does not flood a log.
        value_preview: String,
        /// What is wrong with it and what to do.
        reason: String,
    },
    /// An application version (see [`crate::Keiro::app_version`]) was
    /// refused: empty, longer than [`crate::MAX_APP_VERSION_BYTES`], or
    /// holding whitespace or control characters.
    #[error(
        "invalid application version `{version}` from {source_name}: {reason}; use a short \
         printable name such as a release tag or commit hash"
    )]
    InvalidAppVersion {
        /// The version's start, escaped, as [`Error::InvalidId`] shows ids.
        version: String,
        /// Where it came from (`KEIRO_APP_VERSION`, `KeiroBuilder::app_version`, …).
        source_name: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A value cannot be journaled as it is: its JSON would not read back
    /// into its type (a NaN or infinite float, which JSON writes as `null`,
    /// or nesting deeper than keiro reads back). Nothing was journaled; for a
    /// step result or a workflow's return value the instance is failed with
    /// this error, as it would fail the same way on every attempt.
    #[error("{what} {reason}; nothing was journaled")]
    NotJournalable {
        /// Whose value and how it got there, naming the workflow, id and
        /// step, e.g. ``step `charge` (#2) of workflow `checkout` id `order-42` returned``.
        what: String,
        /// What in the value cannot be stored, where, and what to do.
        reason: String,
    },
    /// A transactional step's body sent `COMMIT` or `ROLLBACK` on its
    /// transaction's connection itself, so its writes committed or rolled
    /// back apart from the step's journal row. Nothing was journaled; the
    /// instance is failed with this error (running the body again could
    /// apply committed writes twice). Fix the body to leave the transaction
    /// to keiro, then [`Keiro::retry`](crate::Keiro::retry) it.
    #[error("{what}: {reason}")]
    TransactionEnded {
        /// The step, naming its workflow and id, e.g. ``transactional step
        /// `debit` (#1) of workflow `pay` id `order-42` ``.
        what: String,
        /// What keiro found and what to do.
        reason: String,
    },
    /// A transactional step's body returned `Ok` although one of its
    /// statements had failed and PostgreSQL had aborted the transaction
    /// there: nothing it wrote can commit, and nothing was journaled. The
    /// run stops like a crash (the instance is retried after a backoff, up
    /// to the runtime's attempts, then failed): fix the body to return the
    /// statement's error, or to run a statement that may fail inside a
    /// savepoint.
    #[error("{what}: {reason}")]
    TransactionAborted {
        /// The step, naming its workflow and id, e.g. ``transactional step
        /// `debit` (#1) of workflow `pay` id `order-42` ``.
        what: String,
        /// What failed (the statement's error when the body ran it through
        /// [`Transaction::postgres`](crate::Transaction::postgres)) and what
        /// to do.
        reason: String,
    },
    /// A value is larger, encoded as JSON, than the runtime's payload limit
    /// ([`KeiroBuilder::max_payload_bytes`](crate::KeiroBuilder::max_payload_bytes),
    /// default 1 MiB). Refused before it is written: nothing was stored. For
    /// a step result or a workflow's return value the instance is failed with
    /// this error, as every attempt would produce the same value.
    #[error(
        "{step} of workflow `{workflow}` id `{id}` is {size} bytes as JSON, over the payload \
         limit of {limit} bytes; nothing was stored: keep large data outside keiro (a file or \
         blob store) and journal its key, or raise KeiroBuilder::max_payload_bytes"
    )]
    PayloadTooLarge {
        /// The workflow whose value it is (for a message, the sender's, or
        /// `(outside a workflow)`).
        workflow: String,
        /// The instance's id (for a message, the recipient's).
        id: String,
        /// Which value: ``step `charge` (#2) result``, `input`, `output`,
        /// ``message on topic `t` ``, ``event `k` ``, ``stream `k` ``.
        step: String,
        /// Its encoded length in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// [`crate::continue_as_new`] was given a call of another workflow.
    #[error(
        "workflow `{name}` (id {id}) cannot continue as `{requested}`; continue_as_new \
         takes a call of the same workflow"
    )]
    ContinueAsOther {
        /// The calling workflow's name.
        name: String,
        /// The calling instance's id.
        id: String,
        /// The workflow of the call given.
        requested: String,
    },
    /// [`crate::init`] was called when a process-wide runtime was already
    /// installed (by an earlier `init`, or on first use of the default).
    #[error(
        "a process-wide keiro runtime is already installed; call keiro::init once, \
         before the first workflow runs"
    )]
    AlreadyInitialized,
    /// No executor identity could be taken: every default slot of this
    /// program on this host is held by a live process, or other processes
    /// keep taking the one asked for.
    #[error("could not take an executor identity: {reason}")]
    NoExecutorId {
        /// Which identities were tried and why each was refused.
        reason: String,
    },
    /// An invariant inside keiro was broken: a bug in keiro, please report it.
    #[error("internal keiro error (a bug in keiro, please report it): {0}")]
    Internal(String),
    /// A listing was given a cursor keiro did not make, or one from a
    /// listing in the other order.
    #[error("invalid listing cursor `{cursor}`: {reason}")]
    InvalidCursor {
        /// The cursor given (its start).
        cursor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A message was sent to an instance that has ended; nothing was queued.
    #[error(
        "workflow instance `{id}` has ended ({status}) and takes no more messages; nothing was \
         sent"
    )]
    NotReceiving {
        /// The instance id.
        id: String,
        /// Its final status (`completed`, `failed`, `cancelled`, …).
        status: String,
    },
    /// A message, event or stream entry does not decode into the type its
    /// reader expects. It is left as it is (a refused message stays queued).
    #[error("{0}")]
    MessageType(Box<TypeMismatch>),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        // The sources a transparent variant forwards are already in the sentence.
        let mut source = std::error::Error::source(self);
        let mut shown = self.to_string();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !shown.contains(&text) {
                write!(f, "\n  caused by: {text}")?;
                shown.push_str(&text);
            }
            source = cause.source();
        }
        Ok(())
    }
}

impl Error {
    /// Whether trying again later may succeed (the store was unreachable or busy).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Store(e) => e.is_transient(),
            Error::Timer(e) => e.is_transient(),
            _ => false,
        }
    }

    /// Whether this is the store's report of a conflict with a concurrent
    /// transaction that running the transaction again from the start may
    /// get past: PostgreSQL's serialization failure (SQLSTATE `40001`) or
    /// deadlock (`40P01`), SQLite's BUSY or LOCKED, or a debounced call's
    /// stale snapshot. A `#[step(transaction, retry_if = ..)]` body that
    /// returns the error of one of keiro's `*_tx` helpers (`send_tx`,
    /// `enqueue_tx`, ..), whose statements keiro does not watch, classifies
    /// it with this.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Store(e) | Error::Timer(crate::timers::TimerError::Store(e)) => e.is_conflict(),
            _ => false,
        }
    }

    /// Refuses a setting: the one error shape of every builder and options check.
    pub(crate) fn invalid_option(option: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidOption {
            option,
            reason: reason.into(),
        }
    }

    pub(crate) fn decode(what: impl Into<String>, source: serde_json::Error) -> Error {
        Error::Decode {
            what: what.into(),
            source: Arc::new(source),
        }
    }

    /// A store error as the caller sees it: a dedup refusal becomes
    /// [`Error::Duplicate`].
    pub(crate) fn from_store(error: StoreError) -> Error {
        match error {
            StoreError::Duplicate {
                queue,
                key,
                existing_id,
            } => Error::Duplicate {
                queue,
                key,
                existing_id,
            },
            refused @ StoreError::DeadlineBeforeStart { .. } => {
                Error::invalid_option("WorkflowCall::debounce", refused.to_string())
            }
            other => Error::Store(other),
        }
    }

    /// Checks an id, name or key handed to keiro (see
    /// [`keiro_store::validate_id`]), refusing it with [`Error::InvalidId`].
    pub(crate) fn check_id(what: &'static str, value: &str) -> Result<()> {
        Error::check_id_within(what, value, crate::MAX_ID_BYTES)
    }

    /// [`Error::check_id`] with another length limit.
    pub(crate) fn check_id_within(what: &'static str, value: &str, max: usize) -> Result<()> {
        keiro_store::validate_id_within(what, value, max).map_err(|error| match error {
            StoreError::InvalidId {
                what,
                value_preview,
                reason,
            } => Error::InvalidId {
                what,
                value_preview,
                reason,
            },
            other => Error::Store(other),
        })
    }

    pub(crate) fn encode(what: impl Into<String>, source: serde_json::Error) -> Error {
        Error::Encode {
            what: what.into(),
            source: Arc::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_from_the_store_or_a_timer_helper_is_told_from_other_errors() {
        let conflict = || StoreError::Conflict {
            step: "debit",
            reason: "deadlock detected".into(),
        };
        assert!(Error::Store(conflict()).is_conflict());
        assert!(Error::Timer(crate::timers::TimerError::Store(conflict())).is_conflict());
        let corrupt = StoreError::Corrupt {
            what: "a row".into(),
        };
        assert!(!Error::Store(corrupt).is_conflict());
        assert!(!Error::invalid_option("x", "y").is_conflict());
    }

    #[test]
    fn debug_is_the_sentence_a_user_can_act_on() {
        let error = Error::ExecutorIdInUse {
            id: "vm".into(),
            host: "vm".into(),
            pid: 42,
        };
        let debug = format!("{error:?}");
        assert_eq!(debug, error.to_string());
        assert!(debug.contains("KEIRO_EXECUTOR_ID"), "{debug}");
        assert!(!debug.contains("ExecutorIdInUse"), "{debug}");
    }

    #[test]
    fn debug_adds_causes_the_sentence_does_not_name() {
        let json = serde_json::from_str::<u32>("\"x\"").unwrap_err();
        let child = Error::ChildFailed {
            name: "kid".into(),
            id: "p/0".into(),
            parent_id: "p".into(),
            source: Arc::new(Error::decode("the output of kid", json)),
        };
        let debug = format!("{child:?}");
        assert!(debug.starts_with(&child.to_string()), "{debug}");
        // Every cause is already in the sentence, so none is repeated.
        assert!(!debug.contains("caused by"), "{debug}");
    }
}

/// What [`Error::MessageType`] found: a value written as one type and read as
/// another.
#[derive(Debug, Clone)]
pub struct TypeMismatch {
    /// What was read (``the next message on topic `t` ``, ``event `k` ``).
    pub what: String,
    /// The reading workflow's name, when read inside one.
    pub workflow: Option<String>,
    /// The instance id the value belongs to.
    pub id: String,
    /// The type the reader expects.
    pub expected: String,
    /// The type it was written as.
    pub found: String,
    /// The decoder's complaint.
    pub reason: String,
}

impl std::fmt::Display for TypeMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of ", self.what)?;
        match &self.workflow {
            Some(name) => write!(f, "workflow `{name}` (id {})", self.id)?,
            None => write!(f, "workflow instance `{}`", self.id)?,
        }
        write!(
            f,
            " is a `{}`, which does not decode into the awaited `{}` ({}); it was left as it is",
            self.found, self.expected, self.reason
        )
    }
}

/// What to do instead of retrying an instance whose refusal says `status`.
fn retry_hint(status: &str) -> &'static str {
    if status.contains(PARENT_RECORDED) {
        "the parent would never see a new result; retry or fork the parent instead"
    } else {
        "only an instance that failed after its crash attempts, or was cancelled, is; \
         `keiro.fork` starts a new run from its journal"
    }
}

/// How [`Error::NotRetryable`]'s status says that a child's parent recorded
/// its result already.
pub(crate) const PARENT_RECORDED: &str = "already recorded this child's result";

/// "1234 ms ahead of" / "1234 ms behind": how far a clock is off, in words.
pub(crate) fn clock_offset_words(offset_ms: i64) -> String {
    if offset_ms >= 0 {
        format!("{offset_ms} ms ahead of")
    } else {
        format!("{} ms behind", offset_ms.unsigned_abs())
    }
}
