//! Building a [`Keiro`]: [`Keiro::connect`], [`Keiro::builder`] and the
//! settings of [`KeiroBuilder`].

use std::sync::Arc;
use std::time::Duration;

use keiro_store::{JournalWriter, SqliteSynchronous, Store, StoreOptions};
use tokio::sync::{watch, Notify, OnceCell};

use super::global::EXECUTOR_ID_ENV;
use super::identity::default_executor_id;
use super::inflight::InFlight;
use super::listener::Wakes;
use super::{Inner, Keiro};
use crate::registry::Registry;
use crate::version::AppVersions;
use crate::Journal;
use crate::{Error, Result};

impl Keiro {
    /// Connects to `url` (`sqlite:path`, `sqlite::memory:`, `postgres://…`),
    /// runs the migrations and collects the workflows linked into this binary.
    pub async fn connect(url: &str) -> Result<Keiro> {
        Keiro::builder(url).connect().await
    }

    /// Settings beyond the URL: executor identity, the instance policy (lease
    /// TTL, crash attempts, suspend threshold), SQLite durability, pool size.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keiro::{Keiro, SqliteSynchronous};
    ///
    /// # async fn demo() -> Result<(), keiro::Error> {
    /// let keiro = Keiro::builder("sqlite:orders.db")
    ///     .sqlite_synchronous(SqliteSynchronous::Normal) // faster; may lose the last commits on power loss
    ///     .suspend_after(Duration::from_secs(5))
    ///     .max_attempts(3)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(url: impl Into<String>) -> KeiroBuilder {
        KeiroBuilder {
            url: url.into(),
            executor_id: None,
            lease_ttl: Duration::from_secs(10),
            max_clock_skew: None,
            max_attempts: 5,
            suspend_after: Duration::from_secs(1),
            no_worker_timeout: Duration::from_secs(30),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            store: StoreOptions::default(),
            app_version: None,
            compatible_versions: Vec::new(),
            journal: Journal::Strict,
        }
    }
}

/// The default of [`KeiroBuilder::max_payload_bytes`]: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// Settings for [`Keiro::builder`]. Its `Debug` shows the URL with every
/// credential replaced by `***` (see [`keiro_store::redact_url`]).
#[derive(Clone)]
pub struct KeiroBuilder {
    url: String,
    executor_id: Option<String>,
    lease_ttl: Duration,
    max_clock_skew: Option<Duration>,
    max_attempts: u32,
    suspend_after: Duration,
    no_worker_timeout: Duration,
    max_payload_bytes: usize,
    store: StoreOptions,
    app_version: Option<String>,
    compatible_versions: Vec<String>,
    journal: Journal,
}

impl std::fmt::Debug for KeiroBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeiroBuilder")
            .field("url", &keiro_store::redact_url(&self.url))
            .field("executor_id", &self.executor_id)
            .field("lease_ttl", &self.lease_ttl)
            .field("max_clock_skew", &self.max_clock_skew)
            .field("max_attempts", &self.max_attempts)
            .field("suspend_after", &self.suspend_after)
            .field("no_worker_timeout", &self.no_worker_timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("store", &self.store)
            .field("app_version", &self.app_version)
            .field("compatible_versions", &self.compatible_versions)
            .field("journal", &self.journal)
            .finish()
    }
}

impl KeiroBuilder {
    /// The owner name on this process's leases, held exclusively: a second
    /// live process asking for it is refused with [`Error::ExecutorIdInUse`],
    /// and a process restarting under it takes over its dead predecessor's
    /// leases at once (on the same host; after 10 s of silence from another).
    ///
    /// Default: [`EXECUTOR_ID_ENV`] if set (also exclusive), else
    /// `{host}/{program}` (the program being the executable's file stem). The
    /// default is shared: when a live process holds it, the first free of
    /// `{host}/{program}#2`, `#3`, … (64 at most) is taken, so any number of
    /// processes of one program run side by side on one host with no
    /// setting. A restarted process takes the lowest slot that is free or
    /// whose holder died, with that holder's leases, and releases the leases
    /// of every other slot of its program whose holder died on this host, so
    /// all their work resumes at once.
    pub fn executor_id(mut self, id: impl Into<String>) -> Self {
        self.executor_id = Some(id.into());
        self
    }

    /// How long a claim on a running instance lasts without renewal (default
    /// 10 s), for runs in this process and those its resume worker drives.
    /// A live run renews it every third of this, so only a dead executor's
    /// claims lapse.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How far this process's clock may be from the database server's
    /// (default: a quarter of [`lease_ttl`](Self::lease_ttl)). Workers compare
    /// lease expiries and wake times by their own clocks, so one whose clock
    /// is off by more than two thirds of the TTL takes live instances'
    /// leases (or has its own taken) and a step body runs twice; a quarter
    /// per worker keeps any two workers within half the TTL of each other.
    ///
    /// On PostgreSQL a process reads the server's clock when it takes its
    /// executor identity and refuses to run workflows with
    /// [`Error::ClockSkew`] when its clock is further off than this; it reads
    /// it again at every executor heartbeat (2.5 s), and while its clock is
    /// off its resume worker claims nothing (no pass, refill or queue
    /// hand-over; its passes fail with `ClockSkew`, logged) until the clock
    /// is back; runs in flight go on. SQLite has no second clock: its
    /// database is a file on this host. A runtime on a manual clock
    /// ([`crate::testing::TestEnv`]) is not checked. `Duration::MAX` turns
    /// the refusal off (the clock is still read, for
    /// [`crate::telemetry::CLOCK_OFFSET`]).
    pub fn max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_clock_skew = Some(skew);
        self
    }

    /// How many crashes (panics) an instance may have before it is marked
    /// failed (default 5), whether it runs in this process or its resume
    /// worker drives it.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// How the workflows that do not say (`#[workflow(journal = "..")]`)
    /// journal their steps (default [`Journal::Strict`]; see [`Journal`] for
    /// what [`Journal::Pipelined`] trades).
    pub fn journal(mut self, journal: Journal) -> Self {
        self.journal = journal;
        self
    }

    /// Waits (`keiro::sleep`) up to this long stay in memory; longer ones
    /// suspend the workflow: its future is dropped, its lease released, and it
    /// costs only its row until due (default 1 s).
    pub fn suspend_after(mut self, threshold: Duration) -> Self {
        self.suspend_after = threshold;
        self
    }

    /// How long [`WorkflowHandle::result`](crate::WorkflowHandle::result) waits
    /// on an instance that is due, held by nobody, and whose workflow name no
    /// live resume worker serves, before it returns [`Error::NoWorker`]
    /// (default 30 s). Nothing about the instance changes: it runs as soon as
    /// a worker that registers its name starts.
    pub fn no_worker_timeout(mut self, timeout: Duration) -> Self {
        self.no_worker_timeout = timeout;
        self
    }

    /// The largest value, in bytes of its JSON encoding, this runtime writes
    /// (default [`DEFAULT_MAX_PAYLOAD_BYTES`], 1 MiB): a workflow's input or
    /// return value, a step's result (`Ok` or `Err`), a message, an event or
    /// a stream value. A larger one is refused before it is written with
    /// [`Error::PayloadTooLarge`]; a step result or return value over it
    /// fails the instance. Must be at least 1.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// The application version recorded with every instance this runtime
    /// creates; its resume worker claims only instances of this version,
    /// of a [compatible](KeiroBuilder::compatible_versions) one, or
    /// unversioned ones (created before versions were recorded).
    ///
    /// Default: [`APP_VERSION_ENV`](crate::APP_VERSION_ENV) if set, else a
    /// hash of every linked workflow's body, so a binary whose workflow code
    /// changed is a new version and leaves the old version's instances to
    /// the old workers (or to [`Keiro::retarget`]). At most
    /// [`MAX_APP_VERSION_BYTES`](crate::MAX_APP_VERSION_BYTES), printable,
    /// no whitespace: another value is refused by
    /// [`connect`](KeiroBuilder::connect) with
    /// [`Error::InvalidAppVersion`].
    pub fn app_version(mut self, version: impl Into<String>) -> Self {
        self.app_version = Some(version.into());
        self
    }

    /// Versions besides [its own](KeiroBuilder::app_version) whose instances
    /// this runtime's resume worker claims too: declare the versions whose
    /// journals this code replays (a release that changed no workflow's
    /// steps). Replaces any earlier list.
    pub fn compatible_versions(
        mut self,
        versions: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.compatible_versions = versions.into_iter().map(Into::into).collect();
        self
    }

    /// SQLite durability (default [`SqliteSynchronous::Full`]).
    pub fn sqlite_synchronous(mut self, sync: SqliteSynchronous) -> Self {
        self.store.sqlite_synchronous = sync;
        self
    }

    /// The connection pool's size (default 8 on PostgreSQL, 4 on SQLite).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.store.max_connections = Some(n);
        self
    }

    /// What stands between keiro and PostgreSQL (default [`Pooler::None`]).
    /// [`Pooler::Transaction`] (also the URL parameter `pooler=transaction`)
    /// makes keiro work through a transaction-pooling proxy such as
    /// pgbouncer in `pool_mode = transaction`: see
    /// [`Pooler::Transaction`] for what changes. Ignored by SQLite.
    ///
    /// [`Pooler::None`]: crate::Pooler::None
    /// [`Pooler::Transaction`]: crate::Pooler::Transaction
    pub fn pooler(mut self, pooler: keiro_store::Pooler) -> Self {
        self.store.pooler = pooler;
        self
    }

    /// A direct PostgreSQL URL, bypassing the transaction-pooling proxy of
    /// [`pooler`](KeiroBuilder::pooler), for the `LISTEN` connection that
    /// wakes workers the moment work arrives, and for migrations. Without
    /// it, behind such a proxy, workers notice new work on their next poll
    /// (`ResumeOptions::poll_interval`, default 1 s).
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.store.listen_url = Some(url.into());
        self
    }

    /// Whether [`connect`](KeiroBuilder::connect) runs the schema migrations
    /// (default `true`). With `false` it changes no schema and creates
    /// nothing: a database whose schema is behind this keiro's is refused
    /// with [`StoreError::NotMigrated`](crate::StoreError::NotMigrated) (run
    /// the migrations first, e.g. `keiro migrate`), and a SQLite file that
    /// does not exist is a connect error instead of a new empty database.
    /// For operator tools, like the `keiro` command, which must not migrate
    /// a database behind an operator's back.
    ///
    /// A runtime that only reads, cancels, retries, forks, answers
    /// awakeables or sends messages (runs no workflow itself, starts no
    /// resume worker) takes no executor identity and leaves no executor row,
    /// whatever this setting.
    pub fn migrate(mut self, run: bool) -> Self {
        self.store.migrate = run;
        self
    }

    /// The clock durable time is read from (default: the system clock);
    /// [`crate::testing::TestEnv`] and the replayer give their runtimes a
    /// manual one.
    pub(crate) fn clock(mut self, clock: keiro_store::Clock) -> Self {
        self.store.clock = clock;
        self
    }

    /// Refuses settings an instance cannot run with.
    fn validate(&self) -> Result<()> {
        if self.lease_ttl < Duration::from_millis(100) {
            return Err(Error::invalid_option(
                "lease_ttl",
                format!(
                    "{:?} is too short; use at least 100 ms (default 10 s)",
                    self.lease_ttl
                ),
            ));
        }
        if self.max_clock_skew == Some(Duration::ZERO) {
            return Err(Error::invalid_option(
                "max_clock_skew",
                "0 would refuse every clock that can be measured off by a microsecond; use at \
                 least a few ms (default a quarter of the lease TTL), or Duration::MAX to turn \
                 the check off",
            ));
        }
        if self.max_attempts == 0 {
            return Err(Error::invalid_option(
                "max_attempts",
                "0 would fail every instance before it runs; use at least 1 (default 5)",
            ));
        }
        if self.max_payload_bytes == 0 {
            return Err(Error::invalid_option(
                "max_payload_bytes",
                "0 would refuse every value, even `null`; use at least 1 (default 1 MiB)",
            ));
        }
        if matches!(&self.executor_id, Some(id) if id.trim().is_empty()) {
            return Err(Error::invalid_option(
                "executor_id",
                "an empty identity names no process; give a non-empty one, or none for the \
                 default `{host}/{program}`",
            ));
        }
        Ok(())
    }

    /// Validates the settings, connects, migrates and collects the registry.
    pub async fn connect(self) -> Result<Keiro> {
        self.validate()?;
        let (requested_id, exclusive) = match self.executor_id.or_else(env_executor_id) {
            Some(id) => (id, true),
            None => (default_executor_id(), false),
        };
        let registry = Registry::collect()?;
        let versions = AppVersions::new(self.app_version, self.compatible_versions, &registry)?;
        let store = Store::connect(&self.url, &self.store).await?;
        let writer = JournalWriter::spawn(store.clone());
        let inflight = Arc::new(InFlight::default());
        let wake = Arc::new(Notify::new());
        let wakes = Wakes::of(&store);
        wakes.register(&inflight, &wake);
        let max_clock_skew = self.max_clock_skew.unwrap_or(self.lease_ttl / 4);
        Ok(Keiro {
            inner: Arc::new(Inner {
                store,
                writer,
                registry,
                versions,
                requested_id,
                exclusive,
                lease_ttl: self.lease_ttl,
                clock: super::clock_check::ClockVerdict::new(max_clock_skew),
                timer_clock: Arc::new(crate::timers::ClockGuard::new(max_clock_skew)),
                max_attempts: self.max_attempts,
                suspend_after: self.suspend_after,
                journal: self.journal,
                no_worker_timeout: self.no_worker_timeout,
                max_payload_bytes: self.max_payload_bytes,
                serving: OnceCell::new(),
                executor: OnceCell::new(),
                stop: watch::channel(false).0,
                wake,
                inflight,
                wakes,
                schedulers: Default::default(),
                claim_turns: Default::default(),
            }),
        })
    }
}

/// [`EXECUTOR_ID_ENV`], when set to something: the one place it is read.
fn env_executor_id() -> Option<String> {
    std::env::var(EXECUTOR_ID_ENV)
        .ok()
        .filter(|id| !id.trim().is_empty())
}
