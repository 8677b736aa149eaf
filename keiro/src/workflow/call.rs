//! What a `#[workflow]` fn returns: [`WorkflowCall`], awaited, started or
//! enqueued.

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::handle::outcome_of;
use super::launch::{check_attach, launch, launch_deferred, wait, Launch};
use super::WorkflowHandle;
use crate::context::{claim_seq, WorkflowContext};
use crate::registry::{BoxFuture, RunFn, SignatureFn};
use crate::{Error, Keiro, Result};

/// A call of a `#[workflow]` fn, not yet running.
///
/// Await it to run the workflow to completion (durably; idempotent on its id),
/// or [`start`](WorkflowCall::start) it in the background. Awaited inside
/// another workflow it runs as a child with a deterministic id.
#[must_use = "a workflow call does nothing until it is awaited or started"]
pub struct WorkflowCall<R> {
    pub(crate) name: &'static str,
    pub(crate) run: RunFn,
    signature: SignatureFn,
    input: Result<String>,
    pub(crate) id: Option<String>,
    keiro: Option<Keiro>,
    pub(crate) parent: ParentSlot,
    deadline: Option<CallDeadline>,
    queue: crate::queue::QueueCall,
    debounce: crate::debounce::DebounceCall,
    _output: PhantomData<fn() -> R>,
}

/// When a call's instance times out, as the caller said it.
#[derive(Debug, Clone, Copy)]
enum CallDeadline {
    /// This long after the instance is recorded.
    After(Duration),
    /// At this time.
    At(SystemTime),
}

impl<R> std::fmt::Debug for WorkflowCall<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowCall")
            .field("name", &self.name)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<R> WorkflowCall<R>
where
    R: Serialize + DeserializeOwned + Send + 'static,
{
    pub(crate) fn new(
        name: &'static str,
        run: RunFn,
        signature: SignatureFn,
        input: Result<String>,
    ) -> Self {
        // Inside a workflow the call takes a step id now, like a step.
        let parent = claim_seq();
        WorkflowCall {
            name,
            run,
            signature,
            input,
            id: None,
            keiro: None,
            parent,
            deadline: None,
            queue: crate::queue::QueueCall::default(),
            debounce: crate::debounce::DebounceCall::default(),
            _output: PhantomData,
        }
    }

    /// Runs under this instance id. The same id for the same workflow with
    /// the same arguments attaches to the existing instance (a finished one
    /// returns its stored output without running anything); the same id with
    /// other arguments is [`Error::InputMismatch`], and for another workflow
    /// [`Error::IdConflict`].
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Gives the instance at most `timeout` from when it is recorded: then it
    /// and its unfinished descendants end as
    /// [`WorkflowStatus::TimedOut`](crate::WorkflowStatus::TimedOut) (no step
    /// body starts after that; a run in progress is stopped like a
    /// cancellation) and [`result`](WorkflowHandle::result) returns
    /// [`Error::TimedOut`]. See [`WorkflowCall::deadline`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.deadline = Some(CallDeadline::After(timeout));
        self
    }

    /// Times the instance out at `deadline` (see [`WorkflowCall::timeout`]).
    /// The deadline is stored with the instance when it is first recorded,
    /// so it survives restarts; a later call attaching to the same id keeps
    /// the stored one. A child's deadline is the earlier of its own and its
    /// parent's.
    pub fn deadline(mut self, deadline: SystemTime) -> Self {
        self.deadline = Some(CallDeadline::At(deadline));
        self
    }

    /// Enqueues on `queue` (declared with [`queue!`](crate::queue!)) instead
    /// of the default queue: its resume workers start the instance within the
    /// queue's limits. Applies to [`enqueue`](WorkflowCall::enqueue) and
    /// [`enqueue_tx`](WorkflowCall::enqueue_tx); starting or awaiting a
    /// queued call is [`Error::InvalidOption`].
    pub fn queue(mut self, queue: &'static crate::Queue) -> Self {
        self.queue.queue = Some(queue);
        self
    }

    /// Within its queue, lower runs first (default 0); equal priorities run
    /// in enqueue order. Needs [`queue`](WorkflowCall::queue).
    pub fn priority(mut self, priority: i64) -> Self {
        self.queue.priority = Some(priority);
        self
    }

    /// The queue's limits apply per partition key: a busy key does not hold
    /// back another. Needs [`queue`](WorkflowCall::queue).
    pub fn partition(mut self, key: impl Into<String>) -> Self {
        self.queue.partition = Some(key.into());
        self
    }

    /// While an unfinished instance of the same queue was enqueued with this
    /// key, enqueueing another is refused with [`Error::Duplicate`] (naming
    /// the one holding it); once it finishes the key is free. Needs
    /// [`queue`](WorkflowCall::queue).
    pub fn dedup(mut self, key: impl Into<String>) -> Self {
        self.queue.dedup = Some(key.into());
        self
    }

    /// Not started before `delay` has passed on the runtime's clock (so
    /// [`TestEnv`](crate::testing::TestEnv)'s virtual time moves it too). On
    /// the default queue or a named one.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.queue.delay = Some(delay);
        self
    }

    /// Debounces the enqueue: the calls of this workflow with the same `key`
    /// form a burst, and the workflow starts once, `delay` after the burst's
    /// last call (on the runtime's clock, so
    /// [`TestEnv`](crate::testing::TestEnv)'s virtual time moves it too),
    /// with the last call's arguments. Every call of one burst returns a
    /// handle to the same instance (the same id), so
    /// [`result`](WorkflowHandle::result) on any of them gives the one run's
    /// result. A call after the instance has started opens a new burst.
    /// Calls from any number of processes fold into one burst on either
    /// backend. See [`max_wait`](WorkflowCall::max_wait) for a burst that
    /// never pauses.
    ///
    /// Applies to [`enqueue`](WorkflowCall::enqueue), in a transaction of its
    /// own (an enqueue without `debounce` keeps the writer's batches), and
    /// [`enqueue_tx`](WorkflowCall::enqueue_tx), in the caller's (on
    /// PostgreSQL the burst's lock is held until it ends, so the burst's
    /// other calls wait for it). A call that waited for another counts its
    /// delay from when it goes on; no call brings the start forward. A
    /// [`timeout`](WorkflowCall::timeout) counts from each call, the last
    /// call's holding. With
    /// [`queue`](WorkflowCall::queue) (and `priority`, `partition`) the
    /// instance runs on that queue within its limits once due, the last
    /// call's queue settings holding. Refused with [`Error::InvalidOption`]
    /// naming the workflow and the option: an empty `key`, a zero `delay`,
    /// a timeout or deadline that would end the instance before the delay
    /// lets it start (without a `max_wait`), together with [`id`](WorkflowCall::id) (the burst picks the id),
    /// [`delay`](WorkflowCall::delay) (the debounce says when it starts) or
    /// [`dedup`](WorkflowCall::dedup) (the burst is the deduplication),
    /// inside a workflow, and on [`start`](WorkflowCall::start) or an await
    /// (which run at once).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # #[keiro::workflow]
    /// # async fn sync_profile(user: u64, fields: Vec<String>) -> u64 { user }
    /// # async fn demo(user_id: u64, fields: Vec<String>) -> keiro::Result<()> {
    /// let handle = sync_profile(user_id, fields)
    ///     .debounce(user_id.to_string(), Duration::from_secs(2))
    ///     .max_wait(Duration::from_secs(30))
    ///     .enqueue()
    ///     .await?;
    /// # let _ = handle;
    /// # Ok(()) }
    /// ```
    pub fn debounce(mut self, key: impl Into<String>, delay: Duration) -> Self {
        self.debounce.debounce = Some((key.into(), delay));
        self
    }

    /// Bounds a debounced burst that never pauses: its instance starts no
    /// later than `max` after the burst's first call, even while calls still
    /// arrive (later calls until it starts still replace its arguments). A
    /// burst holds the tightest bound any of its calls gave, each counted
    /// from the burst's first call. Needs
    /// [`debounce`](WorkflowCall::debounce), and `max` at least its delay;
    /// otherwise [`Error::InvalidOption`].
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.debounce.max_wait = Some(max);
        self
    }

    /// Refuses to start or await a call given queue or debounce settings,
    /// which only an enqueue honours.
    pub(crate) fn refuse_queue(&self, how: &str) -> Result<()> {
        self.debounce.refuse_run(self.name, how)?;
        if !self.queue.is_set() {
            return Ok(());
        }
        Err(Error::InvalidOption {
            option: "WorkflowCall::queue",
            reason: format!(
                "workflow `{}` was given queue settings (queue, priority, partition, dedup or \
                 delay) but {how}, which runs it at once in this process; call `.enqueue()` and \
                 wait on the handle's `result()` instead",
                self.name
            ),
        })
    }

    /// Refuses a call given settings that schedule `schedule` would not
    /// keep: it stores the workflow and its arguments only, so a queue,
    /// debounce, timeout or deadline would be dropped in silence.
    pub(crate) fn refuse_for_schedule(&self, schedule: &str) -> Result<()> {
        match self.instance_settings() {
            None => Ok(()),
            Some(what) => Err(Error::invalid_option(
                "create_schedule",
                format!(
                    "the call of workflow `{}` for schedule `{schedule}` was given {what}, which a \
                     schedule does not keep (it stores the workflow and its arguments only); \
                     pass the call without them",
                    self.name
                ),
            )),
        }
    }

    /// Refuses a call given to `keiro::continue_as_new` by instance `id`
    /// with settings the next generation would not keep: it takes the
    /// call's arguments only, and stays the same instance, on its queue and
    /// under its deadline.
    pub(crate) fn refuse_for_continue_as_new(&self, id: &str) -> Result<()> {
        let other_id = self
            .id
            .as_deref()
            .filter(|given| *given != id)
            .map(|_| "an `.id(..)` other than its own");
        match other_id.or(self.instance_settings()) {
            None => Ok(()),
            Some(what) => Err(Error::invalid_option(
                "keiro::continue_as_new",
                format!(
                    "the call of workflow `{}` that instance `{id}` continues as was given {what}, \
                     which the next generation does not take: it is the same instance, on the \
                     same queue and under the same deadline, with the call's arguments only; \
                     pass the call without them",
                    self.name
                ),
            )),
        }
    }

    /// The first setting of this call that only a new instance of its own
    /// keeps (queue, debounce, deadline), named for an error; `None` when it
    /// was given none.
    fn instance_settings(&self) -> Option<&'static str> {
        [
            (
                self.queue.is_set(),
                "queue settings (queue, priority, partition, dedup or delay)",
            ),
            (self.debounce.is_set(), "`.debounce(..)` or `.max_wait(..)`"),
            (self.deadline.is_some(), "`.timeout(..)` or `.deadline(..)`"),
        ]
        .into_iter()
        .find_map(|(set, what)| set.then_some(what))
    }

    /// Runs on `keiro` instead of the process-wide runtime.
    pub fn on(mut self, keiro: &Keiro) -> Self {
        self.keiro = Some(keiro.clone());
        self
    }

    /// Records the instance and runs it in the background in this process,
    /// holding its lease. Errors at once if the store is unreachable or the id
    /// belongs to another workflow or call (see [`WorkflowCall::id`]).
    pub async fn start(self) -> Result<WorkflowHandle<R>> {
        self.refuse_queue("was started")?;
        let keiro = self.runtime().await?;
        let launch_spec = self.launch_spec(&keiro)?;
        let id = launch_spec.id.clone();
        launch(&keiro, launch_spec).await?;
        Ok(WorkflowHandle::new(keiro, id, Some(self.run)))
    }

    /// Records the instance as pending without running it here: whichever
    /// resume worker claims it first runs it (how a web process hands work to a
    /// fleet of workers). Idempotent on the id; takes no executor identity.
    pub async fn enqueue(self) -> Result<WorkflowHandle<R>> {
        let keiro = self.runtime().await?;
        let spec = self.launch_spec(&keiro)?;
        if self.debounce.is_set() {
            return self.enqueue_debounced(keiro, spec).await;
        }
        if self.queue.is_set() {
            return self.enqueue_queued(keiro, spec).await;
        }
        let (row, created) = keiro.writer().create(spec.create_request(None)).await?;
        check_attach(&row, &spec)?;
        enqueued(keiro, spec.id, created).await
    }

    /// [`enqueue`](WorkflowCall::enqueue) with queue settings, through the
    /// writer: concurrent enqueues share a commit, and a dedup refusal still
    /// fails this call alone (the writer then records that round's enqueues
    /// one by one).
    async fn enqueue_queued(self, keiro: Keiro, spec: Launch) -> Result<WorkflowHandle<R>> {
        let queued = self.queue.queued(self.name, keiro.now_us())?;
        let (row, created) = keiro
            .writer()
            .create_queued(spec.create_request(None), (&queued).into())
            .await
            .map_err(Error::from_store)?;
        check_attach(&row, &spec)?;
        enqueued(keiro, spec.id, created).await
    }

    /// [`enqueue`](WorkflowCall::enqueue) with [`debounce`](WorkflowCall::debounce):
    /// joins the open burst or opens one, in a transaction of its own.
    async fn enqueue_debounced(self, keiro: Keiro, spec: Launch) -> Result<WorkflowHandle<R>> {
        let debounce = self.debounced(&keiro)?;
        let queued = self.queue.queued(self.name, keiro.now_us())?;
        let (row, created) = keiro
            .raw_store()
            .create_debounced(&spec.new_instance(), &queued, &debounce)
            .await
            .map_err(Error::from_store)?;
        enqueued(keiro, row.id, created).await
    }

    /// The store's debounce settings, misuse refused (a timeout or deadline
    /// read on `keiro`'s clock).
    fn debounced(&self, keiro: &Keiro) -> Result<keiro_store::Debounce<'_>> {
        let mut debounce = self.debounce.debounced(
            self.name,
            self.id.is_some(),
            self.parent.is_some(),
            &self.queue,
        )?;
        // The instance starts the debounce delay after the burst's last call
        // at the earliest, and each call sets its deadline afresh: a timeout
        // counts from the call, and moves with the burst's start when that
        // is later (see `Debounce::deadline_after_start_us`), so one no
        // longer than the delay always ends first. (An absolute deadline
        // under a `max_wait`: a late call of a long burst may see it start
        // sooner, so no refusal here; the store refuses any absolute
        // deadline not after the start it computes under the burst's lock.)
        let ends_first = match self.deadline {
            None => None,
            Some(CallDeadline::After(timeout)) => {
                let after_start = crate::time::duration_us(timeout) - debounce.delay_us;
                debounce.deadline_after_start_us = Some(after_start);
                (after_start <= 0)
                    .then(|| format!("`.timeout({timeout:?})`, no longer than its debounce delay"))
            }
            Some(CallDeadline::At(_)) if debounce.max_wait_us.is_some() => None,
            Some(CallDeadline::At(at)) => {
                let earliest = keiro.now_us().saturating_add(debounce.delay_us);
                (crate::time::to_us(at) <= earliest)
                    .then(|| "a `.deadline(..)` before its debounce delay ends".to_owned())
            }
        };
        match ends_first {
            Some(what) => Err(Error::invalid_option(
                "WorkflowCall::debounce",
                format!(
                    "workflow `{}` was given {what}: it would time out before it ran. A \
                     debounced call's timeout counts from the call (the last call's holds), and \
                     the instance keeps the timeout less the delay to run from when it starts \
                     (the delay after the burst's last call, or its `max_wait` bound): give one \
                     longer than the delay, or a deadline after it",
                    self.name
                ),
            )),
            None => Ok(debounce),
        }
    }

    /// Records the instance as pending inside the caller's own transaction on
    /// keiro's database (the outbox pattern): it exists, for any resume
    /// worker to run, exactly when `tx` commits, and not at all when it rolls
    /// back. Otherwise like [`enqueue`](WorkflowCall::enqueue): idempotent on
    /// the id (an existing instance must be the same call), takes no executor
    /// identity.
    ///
    /// On PostgreSQL workers are notified at commit (`NOTIFY` inside the
    /// transaction). On SQLite nothing can run at commit: a resume worker
    /// finds the instance at its next poll. On SQLite begin the transaction
    /// with `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`).
    ///
    /// A [debounced](WorkflowCall::debounce) call must see its burst as it
    /// is now: in a transaction whose snapshot is older than the burst's last
    /// change (PostgreSQL `REPEATABLE READ` or `SERIALIZABLE`, a deferred
    /// SQLite transaction that read first) it writes nothing and is refused
    /// with [`StoreError::BurstConflict`](crate::StoreError::BurstConflict); run the transaction
    /// again from the start.
    ///
    /// ```no_run
    /// # #[keiro::workflow]
    /// # async fn ship(order: u64) -> u64 { order }
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
    /// let handle = ship(42).id("ship-42").enqueue_tx(&mut tx).await?;
    /// tx.commit().await?; // the order and its workflow, together
    /// # let _ = handle;
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_tx<'t, 'c>(
        self,
        tx: impl Into<keiro_store::TimerTx<'t, 'c>>,
    ) -> Result<WorkflowHandle<R>>
    where
        'c: 't,
    {
        let keiro = self.runtime().await?;
        let spec = self.launch_spec(&keiro)?;
        let new = spec.new_instance();
        if self.debounce.is_set() {
            let debounce = self.debounced(&keiro)?;
            let queued = self.queue.queued(self.name, keiro.now_us())?;
            let clock = keiro.clock();
            let (row, _) = keiro_store::create_debounced_tx(tx, &new, &queued, &debounce, clock)
                .await
                .map_err(Error::from_store)?;
            return Ok(WorkflowHandle::new(keiro, row.id, None));
        }
        let now_us = keiro.now_us();
        let (row, _) = if self.queue.is_set() {
            let queued = self.queue.queued(self.name, now_us)?;
            keiro_store::create_queued_tx(tx, &new, &queued, keiro.clock())
                .await
                .map_err(Error::from_store)?
        } else {
            keiro_store::create_instance_tx(tx, &new, now_us).await?
        };
        check_attach(&row, &spec)?;
        Ok(WorkflowHandle::new(keiro, spec.id, None))
    }

    /// The encoded arguments.
    pub(crate) fn encoded_input(&self) -> Result<String> {
        self.input.clone()
    }

    pub(crate) async fn runtime(&self) -> Result<Keiro> {
        match (&self.keiro, &self.parent) {
            (Some(keiro), _) => Ok(keiro.clone()),
            (None, Some((cx, _))) => Ok(cx.keiro.clone()),
            (None, None) => crate::runtime::global().await,
        }
    }

    /// The instance to launch: the given id, else a deterministic one inside a
    /// workflow (`<parent id>/<step seq>` in the first generation,
    /// `<parent id>/<generation>.<step seq>` after continue-as-new, so a later
    /// generation never meets an earlier one's child), else a fresh UUID.
    /// The input is refused when longer than `keiro`'s `max_payload_bytes`; a
    /// timeout counts from `keiro`'s clock; the instance records `keiro`'s
    /// application version.
    pub(crate) fn launch_spec(&self, keiro: &Keiro) -> Result<Launch> {
        let max_payload_bytes = keiro.max_payload_bytes();
        let id = match (&self.id, &self.parent) {
            (Some(id), _) => id.clone(),
            (None, Some((cx, seq))) if cx.generation == 0 => format!("{}/{seq}", cx.id),
            (None, Some((cx, seq))) => format!("{}/{}.{seq}", cx.id, cx.generation),
            (None, None) => uuid::Uuid::new_v4().to_string(),
        };
        if id.is_empty() {
            return Err(Error::EmptyId {
                name: self.name.to_owned(),
            });
        }
        let what = match self.parent {
            Some(_) => "child id",
            None => "workflow id",
        };
        Error::check_id(what, &id)?;
        Error::check_id("workflow name", self.name)?;
        let input = self.input.clone().map_err(|error| match error {
            Error::NotJournalable { reason, .. } => Error::NotJournalable {
                what: format!("the arguments of workflow `{}` id `{id}` hold", self.name),
                reason,
            },
            other => other,
        })?;
        crate::json::check_size(&input, max_payload_bytes, self.name, &id, || {
            "the input (arguments)".to_owned()
        })?;
        Ok(Launch {
            name: self.name,
            run: self.run,
            id,
            input,
            signature: (self.signature)(),
            parent: self
                .parent
                .as_ref()
                .map(|(cx, seq)| (cx.id.clone(), cx.generation, *seq)),
            deadline: self.deadline.map(|deadline| match deadline {
                CallDeadline::After(timeout) => keiro
                    .now_us()
                    .saturating_add(crate::time::duration_us(timeout)),
                CallDeadline::At(at) => crate::time::to_us(at),
            }),
            traceparent: crate::trace::current_traceparent(),
            app_version: keiro.app_version().to_owned(),
            skeleton_hash: keiro.registry().skeleton_hash(self.name),
        })
    }

    async fn run_to_end(self) -> Result<R> {
        self.refuse_queue("was awaited")?;
        match self.parent.clone() {
            None => {
                let keiro = self.runtime().await?;
                let spec = self.launch_spec(&keiro)?;
                let id = spec.id.clone();
                // Awaited here with nothing outside waiting on it: its
                // instance may be recorded with its first step or its end.
                let receiver = match spec.deadline {
                    None => match launch_deferred(&keiro, spec).await? {
                        Ok(receiver) => receiver,
                        Err(spec) => launch(&keiro, spec).await?,
                    },
                    Some(_) => launch(&keiro, spec).await?,
                };
                let row = wait(&keiro, &id, receiver, Some(self.run)).await?;
                outcome_of(&row)
            }
            Some(_) => crate::workflow::child::start_child(self).await?.await,
        }
    }
}

impl<R> crate::context::Durable for WorkflowCall<R> where
    R: Serialize + DeserializeOwned + Send + 'static
{
}

impl<R> IntoFuture for WorkflowCall<R>
where
    R: Serialize + DeserializeOwned + Send + 'static,
{
    type Output = Result<R>;
    type IntoFuture = BoxFuture<'static, Result<R>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run_to_end())
    }
}

/// The handle of an enqueued instance, after waking the workers when the
/// enqueue `created` it. The instance is committed: a lost notification
/// only costs latency (workers poll), so it never fails the enqueue.
async fn enqueued<R>(keiro: Keiro, id: String, created: bool) -> Result<WorkflowHandle<R>>
where
    R: Serialize + DeserializeOwned + Send + 'static,
{
    if created {
        keiro.wake_all_workers("an enqueue").await;
    }
    Ok(WorkflowHandle::new(keiro, id, None))
}

/// A context shared by a parent and the child calls it makes.
pub(crate) type ParentSlot = Option<(Arc<WorkflowContext>, i64)>;
