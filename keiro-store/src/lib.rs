//! keiro's storage layer: the workflow journal and durable timers on SQLite
//! and PostgreSQL.
//!
//! [`Store`] is the one entry point. It is an enum over the two concrete
//! backends, [`SqliteStore`] and [`PostgresStore`], which implement the same
//! operations with each database's own strengths. Migrations are embedded
//! ([`SQLITE_MIGRATOR`], [`POSTGRES_MIGRATOR`]) and run by [`Store::connect`].
//!
//! Steps reach the journal through a [`JournalWriter`], which commits whatever
//! queued while the previous commit was in flight as one transaction.

mod error;
mod options;
mod postgres;
mod postgres_resume;
mod sqlite;
mod timers;
mod types;
mod worker_workflows;
mod writer;

pub use error::{redact as redact_url, StoreError};
pub use options::{SqliteSynchronous, StoreOptions};
pub use postgres::{PostgresStore, POSTGRES_MIGRATOR};
pub use sqlite::{SqliteStore, SQLITE_MIGRATOR};
pub use timers::{
    cancel_timer_tx, schedule_timer_once_tx, schedule_timer_tx, timer_sort_key, NewTimer,
    ReasonMatch, ResumeClaimOutcome, ResumeUpdate, ScheduleOutcome, TimerListKind, TimerQuery,
    TimerRecord, TimerStatus, TimerTx, TimerUpdate,
};
pub use types::{
    now_ms, AppendOutcome, BlockReason, Blocked, Cancellation, Crash, ExecutorRow, Finish,
    InstanceRow, InstanceStatus, Lease, NewInstance, ParentLink, Registered, Resolution, StepRow,
};
pub use writer::{CreateRequest, FinishRequest, JournalWriter};

/// A `Result` whose error is [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A connected, migrated journal store.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded SQLite backend.
    Sqlite(SqliteStore),
    /// The PostgreSQL backend.
    Postgres(PostgresStore),
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            Store::Sqlite($store) => $body,
            Store::Postgres($store) => $body,
        }
    };
}

impl Store {
    /// Connects to `url` and runs the embedded migrations.
    ///
    /// `sqlite:path` / `sqlite://path` (the file is created if missing) and
    /// `sqlite::memory:` select SQLite; `postgres://…` / `postgresql://…` select
    /// PostgreSQL. Any other scheme is refused with [`StoreError::InvalidUrl`].
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Store> {
        if url.starts_with("sqlite:") {
            Ok(Store::Sqlite(SqliteStore::connect(url, options).await?))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Store::Postgres(PostgresStore::connect(url, options).await?))
        } else {
            Err(StoreError::InvalidUrl {
                url: error::redact(url),
                reason: "expected a URL starting with `sqlite:`, `postgres://` or `postgresql://`"
                    .into(),
            })
        }
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Records a new instance, or returns the existing one with that id.
    /// The `bool` is `true` when this call created the row.
    pub async fn create_instance(&self, new: &NewInstance<'_>) -> Result<(InstanceRow, bool)> {
        dispatch!(self, s => s.create_instance(new).await)
    }

    /// Like [`Store::create_instance`] for several instances, in one transaction.
    pub async fn create_instances(
        &self,
        news: &[NewInstance<'_>],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        dispatch!(self, s => s.create_instances(news).await)
    }

    /// Reads one instance.
    pub async fn get_instance(&self, id: &str) -> Result<Option<InstanceRow>> {
        dispatch!(self, s => s.get_instance(id).await)
    }

    /// Claims an unfinished instance for `lease.owner` when nobody holds a live
    /// lease on it (or the owner already does), marking it running. Returns the
    /// claimed row, or `None` when it is finished, missing or leased elsewhere.
    pub async fn claim(&self, id: &str, lease: Lease<'_>) -> Result<Option<InstanceRow>> {
        dispatch!(self, s => s.claim(id, lease).await)
    }

    /// Extends a lease `lease.owner` holds. `false` when it no longer holds it.
    pub async fn renew_lease(&self, id: &str, lease: Lease<'_>) -> Result<bool> {
        dispatch!(self, s => s.renew_lease(id, lease).await)
    }

    /// Drops `owner`'s lease on an instance, leaving its status as it is.
    pub async fn release(&self, id: &str, owner: &str) -> Result<()> {
        dispatch!(self, s => s.release(id, owner).await)
    }

    /// Reads every recorded step of one generation, in sequence order.
    pub async fn load_journal(&self, id: &str, generation: i64) -> Result<Vec<StepRow>> {
        dispatch!(self, s => s.load_journal(id, generation).await)
    }

    /// Records step results in one transaction. A step id that is already
    /// recorded keeps its first result, which is returned as
    /// [`AppendOutcome::Existing`].
    pub async fn append_steps(&self, rows: &[StepRow]) -> Result<Vec<AppendOutcome>> {
        dispatch!(self, s => s.append_steps(rows).await)
    }

    /// Moves an unfinished instance to a final status, releasing the lease.
    /// Applies only while `finish.owner` holds the lease or nobody does;
    /// returns whether it applied.
    pub async fn finish(&self, finish: &Finish<'_>) -> Result<bool> {
        dispatch!(self, s => s.finish(finish).await)
    }

    /// Like [`Store::finish`] for several instances, in one transaction.
    pub async fn finish_many(&self, finishes: &[Finish<'_>]) -> Result<Vec<bool>> {
        dispatch!(self, s => s.finish_many(finishes).await)
    }

    /// Suspends a running instance `owner` holds, releasing the lease: it
    /// costs only its row until due at `wake_at` (never by time when `None`).
    /// When it awaits step `awaiting` (an awakeable or a child) and that step
    /// was recorded meanwhile, it is due at once instead. Returns whether it
    /// applied.
    pub async fn suspend(
        &self,
        id: &str,
        generation: i64,
        owner: &str,
        wake_at: Option<i64>,
        awaiting: Option<i64>,
    ) -> Result<bool> {
        dispatch!(self, s => s.suspend(id, generation, owner, wake_at, awaiting).await)
    }

    /// Reads one recorded step.
    pub async fn get_step(&self, id: &str, generation: i64, seq: i64) -> Result<Option<StepRow>> {
        dispatch!(self, s => s.get_step(id, generation, seq).await)
    }

    /// Records the resolution `row` of an awaitable created at step `created`
    /// of the same instance and generation (a step of kind `kind`), and makes
    /// a suspended waiter due, in one transaction. The first resolution wins.
    pub async fn resolve(&self, created: i64, kind: &str, row: &StepRow) -> Result<Resolution> {
        dispatch!(self, s => s.resolve(created, kind, row).await)
    }

    /// Cancels an unfinished instance and its unfinished descendants in one
    /// transaction; each cancelled child reports to its parent.
    pub async fn cancel(&self, id: &str) -> Result<Cancellation> {
        dispatch!(self, s => s.cancel(id).await)
    }

    /// How many awakeables of unfinished instances have no answer yet.
    pub async fn count_pending_awakeables(&self) -> Result<u64> {
        dispatch!(self, s => s.count_pending_awakeables().await)
    }

    /// Ends generation `generation` of an instance `owner` holds and starts the
    /// next with `input` and an empty journal, due now. Old steps are kept.
    pub async fn continue_as_new(
        &self,
        id: &str,
        generation: i64,
        owner: &str,
        input: &str,
    ) -> Result<bool> {
        dispatch!(self, s => s.continue_as_new(id, generation, owner, input).await)
    }

    /// Puts an instance set aside for non-determinism back to `pending`, keeping
    /// its journal, so the fixed code can resume it. Returns whether it applied.
    pub async fn requeue_set_aside(&self, id: &str) -> Result<bool> {
        dispatch!(self, s => s.requeue_set_aside(id).await)
    }

    /// Unfinished instances that are due now (pending, crashed with a lapsed
    /// lease, or suspended past their wake time), earliest first.
    pub async fn find_due(&self, limit: i64) -> Result<Vec<InstanceRow>> {
        dispatch!(self, s => s.find_due(limit).await)
    }

    /// Claims up to `limit` due instances of the `workflows` for
    /// `lease.owner` in one statement, earliest first (on PostgreSQL with
    /// `SKIP LOCKED`, so concurrent workers take disjoint batches). An
    /// instance is taken only when its name is registered with the same
    /// signature, or it has none recorded.
    pub async fn claim_due(
        &self,
        lease: Lease<'_>,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<InstanceRow>> {
        dispatch!(self, s => s.claim_due(lease, workflows, limit).await)
    }

    /// Due instances `owner` cannot claim: of names not in `workflows`, of a
    /// name registered there with another signature, or under another
    /// executor's live lease.
    pub async fn find_blocked(
        &self,
        owner: &str,
        workflows: &[Registered<'_>],
        limit: i64,
    ) -> Result<Vec<Blocked>> {
        dispatch!(self, s => s.find_blocked(owner, workflows, limit).await)
    }

    /// Makes every unfinished instance leased by `owner` due now, so a process
    /// restarting under a dead predecessor's identity resumes its work at once.
    pub async fn reclaim_own(&self, owner: &str) -> Result<u64> {
        dispatch!(self, s => s.reclaim_own(owner).await)
    }

    /// Counts a crash against an instance `crash.owner` holds and releases it:
    /// due again at `crash.retry_at`, or `failed` at `crash.max_attempts`.
    /// Returns the new status and attempt count, or `None` if the lease was lost.
    pub async fn record_crash(&self, crash: &Crash<'_>) -> Result<Option<(InstanceStatus, i64)>> {
        dispatch!(self, s => s.record_crash(crash).await)
    }

    /// Wakes resume workers and waiters on instance `id` (empty: none in
    /// particular) in other processes (PostgreSQL `NOTIFY`; SQLite ones share
    /// the process and are woken in memory).
    pub async fn wake_workers(&self, id: &str) -> Result<()> {
        match self {
            Store::Sqlite(_) => Ok(()),
            Store::Postgres(s) => s.wake_workers(id).await,
        }
    }

    /// Reads an executor identity's registration.
    pub async fn get_executor(&self, id: &str) -> Result<Option<ExecutorRow>> {
        dispatch!(self, s => s.get_executor(id).await)
    }

    /// Reads identity `base` and its numbered siblings `base#2`, `base#3`, …
    /// (the default identities of several processes of one program on one
    /// host), ordered by id.
    pub async fn list_executors(&self, base: &str) -> Result<Vec<ExecutorRow>> {
        dispatch!(self, s => s.list_executors(base).await)
    }

    /// Registers an identity: inserts it when `replacing` is `None`, else takes
    /// it over from the process holding token `replacing`. Returns whether it
    /// applied (another process may have won the race).
    pub async fn put_executor(
        &self,
        executor: &ExecutorRow,
        replacing: Option<&str>,
    ) -> Result<bool> {
        dispatch!(self, s => s.put_executor(executor, replacing).await)
    }

    /// Refreshes a held identity's heartbeat; `false` when it was taken over.
    pub async fn heartbeat_executor(&self, id: &str, token: &str) -> Result<bool> {
        dispatch!(self, s => s.heartbeat_executor(id, token).await)
    }

    /// Gives up identity `id` held under `token` and, in the same
    /// transaction, releases every lease held under it: those unfinished
    /// instances keep their status and attempts and are due at once for any
    /// worker. Returns how many were released, or `None` (nothing changed)
    /// when `token` no longer holds the identity.
    pub async fn remove_executor(&self, id: &str, token: &str) -> Result<Option<u64>> {
        dispatch!(self, s => s.remove_executor(id, token).await)
    }

    /// Records that the resume worker of executor `executor_id` serves these
    /// workflow names (replacing what it recorded before).
    pub async fn register_workflows(&self, executor_id: &str, names: &[&str]) -> Result<()> {
        dispatch!(self, s => s.register_workflows(executor_id, names).await)
    }

    /// Whether a worker whose executor sent a heartbeat at or after
    /// `alive_since` (ms since the Unix epoch) serves workflow `name`.
    pub async fn is_served(&self, name: &str, alive_since: i64) -> Result<bool> {
        dispatch!(self, s => s.is_served(name, alive_since).await)
    }

    /// Closes the connection pool.
    pub async fn close(&self) {
        dispatch!(self, s => s.close().await)
    }
}
