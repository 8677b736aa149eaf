//! Group commit: one writer task per store batches the runtime's concurrent
//! writes (new instances, step results, finished instances with the step
//! rows their runs journaled last) into shared transactions.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::{
    AppendOutcome, Finish, GcProgress, GcRequest, HandOver, InstanceRow, InstanceStatus, Lease,
    NewInstance, NewMessage, ParentLink, Queued, Result, SendOutcome, StepRow, StepTiming, Store,
    StoreError, Take, Taken,
};

/// The most operations one batch carries.
const MAX_BATCH: usize = 1024;

/// An owned [`NewInstance`], to hand to the writer.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// The instance id.
    pub id: String,
    /// The registered workflow name.
    pub name: String,
    /// The JSON-encoded arguments.
    pub input: String,
    /// The workflow's signature (see [`NewInstance::signature`]).
    pub signature: Option<String>,
    /// The parent id, generation and step seq, for a child.
    pub parent: Option<(String, i64, i64)>,
    /// The owner and TTL (µs) of a lease to take at once; `None` for pending.
    pub lease: Option<(String, i64)>,
    /// When the instance times out (see [`NewInstance::deadline`]).
    pub deadline: Option<i64>,
    /// The trace it continues (see [`NewInstance::traceparent`]).
    pub traceparent: Option<String>,
    /// The version it runs under (see [`NewInstance::app_version`]).
    pub app_version: Option<String>,
    /// Its code's skeleton hash (see [`NewInstance::skeleton_hash`]).
    pub skeleton_hash: Option<String>,
}

/// An owned [`Queued`]: where a new instance waits on a named queue, to
/// hand to the writer with its [`CreateRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuedRequest {
    /// The queue's name; `None`: the default queue.
    pub queue: Option<String>,
    /// Lower runs first within the queue (see [`Queued::priority`]).
    pub priority: i64,
    /// The key the queue's limits apply per (`""`: none).
    pub partition: String,
    /// The dedup key (see [`Queued::dedup`]).
    pub dedup: Option<String>,
    /// Not claimed before this time (µs since the Unix epoch, store clock).
    pub not_before: Option<i64>,
}

impl QueuedRequest {
    /// The placement to record, borrowed.
    pub fn queued(&self) -> Queued<'_> {
        Queued {
            queue: self.queue.as_deref(),
            priority: self.priority,
            partition: &self.partition,
            dedup: self.dedup.as_deref(),
            not_before: self.not_before,
        }
    }
}

impl From<&Queued<'_>> for QueuedRequest {
    fn from(queued: &Queued<'_>) -> QueuedRequest {
        QueuedRequest {
            queue: queued.queue.map(str::to_owned),
            priority: queued.priority,
            partition: queued.partition.to_owned(),
            dedup: queued.dedup.map(str::to_owned),
            not_before: queued.not_before,
        }
    }
}

/// An owned [`Finish`], to hand to the writer.
#[derive(Debug, Clone)]
pub struct FinishRequest {
    /// The instance id.
    pub id: String,
    /// The generation that finished.
    pub generation: i64,
    /// The executor finishing it.
    pub owner: String,
    /// The final status.
    pub status: InstanceStatus,
    /// The JSON-encoded output.
    pub output: Option<String>,
    /// A diagnostic.
    pub error: Option<String>,
}

/// An owned [`NewMessage`], to hand to the writer.
#[derive(Debug, Clone)]
pub struct MessageRequest {
    /// The receiving instance.
    pub workflow_id: String,
    /// The queue within it.
    pub topic: String,
    /// The JSON-encoded message.
    pub payload: String,
    /// The sender's type.
    pub type_name: Option<String>,
    /// A send with a key already used for this instance is a no-op.
    pub idempotency_key: Option<String>,
    /// The sending step of a workflow, journaled with the message.
    pub journal: Option<StepRow>,
}

enum Op {
    Send(MessageRequest, oneshot::Sender<Result<SendOutcome>>),
    Take(Take, oneshot::Sender<Result<Taken>>),
    Create(CreateRequest, oneshot::Sender<Result<(InstanceRow, bool)>>),
    CreateQueued(CreateQueued, oneshot::Sender<Result<(InstanceRow, bool)>>),
    CreateEnded(CreateEnded, oneshot::Sender<Result<(InstanceRow, bool)>>),
    Step(TimedStep, oneshot::Sender<Result<AppendOutcome>>),
    /// Step rows that must share a round.
    Steps(Pending<TimedStep, AppendOutcome>),
    /// A run's step rows, each recorded only if the ones before it were.
    Chain(Chain, oneshot::Sender<Result<Vec<AppendOutcome>>>),
    Finish(
        Finishing,
        oneshot::Sender<Result<(bool, Option<InstanceRow>)>>,
    ),
    Gc(GcRequest, oneshot::Sender<Result<GcProgress>>),
}

/// Commits the runtime's writes in shared transactions.
///
/// It never waits to fill a batch: each round commits whatever queued while
/// the earlier rounds were in flight (new instances, then step results, then
/// finished instances: at most three commits, however many workflows), so a
/// lone workflow pays one commit per write and a thousand concurrent ones pay
/// a handful. On PostgreSQL up to four rounds commit at once (see
/// `rounds_in_flight`); on SQLite one at a time. Every call returns only once
/// its write is durable. Operations of one workflow never share a round, nor
/// run in two at once: each waits for the previous to be durable.
#[derive(Debug, Clone)]
pub struct JournalWriter {
    sender: mpsc::UnboundedSender<Op>,
    /// Rounds that committed workflow writes (see [`JournalWriter::rounds`]).
    rounds: Arc<AtomicU64>,
    /// The store's clock, for the creation stamps of queued instances.
    clock: crate::Clock,
}

impl JournalWriter {
    /// Starts the writer task on the current tokio runtime. It stops when every
    /// clone of the returned handle is dropped.
    pub fn spawn(store: Store) -> JournalWriter {
        let (sender, receiver) = mpsc::unbounded_channel();
        let rounds = Arc::new(AtomicU64::new(0));
        let clock = store.clock().clone();
        tokio::spawn(run(store, receiver, rounds.clone()));
        JournalWriter {
            sender,
            rounds,
            clock,
        }
    }

    /// How many rounds of workflow writes (anything but gc batches) the
    /// writer has begun so far. A gc caller that sees it move while a batch
    /// ran knows workflows are writing in this process, and yields to them.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Records one step result and waits until it is committed. If the step id
    /// was already recorded, the first result wins and is returned.
    pub async fn append(&self, row: StepRow) -> Result<AppendOutcome> {
        self.append_timed(row, StepTiming::default()).await
    }

    /// [`JournalWriter::append`], journaling how the step's body ran.
    pub async fn append_timed(&self, row: StepRow, timing: StepTiming) -> Result<AppendOutcome> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::Step(TimedStep { row, timing }, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// Records several step results, queued together so they usually share
    /// one commit, and waits until all are committed; each outcome as
    /// [`JournalWriter::append`] gives it. Each row comes with how its body
    /// ran (see [`JournalWriter::append_timed`]).
    pub async fn append_together(
        &self,
        rows: Vec<(StepRow, StepTiming)>,
    ) -> Result<Vec<AppendOutcome>> {
        // One op, so the rows always share a round: rounds may commit side by
        // side, and rows sent one by one could land in two of them and commit
        // in either order.
        let mut answers = Vec::with_capacity(rows.len());
        let mut steps = Vec::with_capacity(rows.len());
        for (row, timing) in rows {
            let (reply, answer) = oneshot::channel();
            steps.push((TimedStep { row, timing }, reply));
            answers.push(answer);
        }
        self.send(Op::Steps(steps))?;
        let mut outcomes = Vec::with_capacity(answers.len());
        for answer in answers {
            outcomes.push(answer.await.map_err(|_| StoreError::WriterStopped)??);
        }
        Ok(outcomes)
    }

    /// [`Store::append_chains`] through the writer for one chain: `rows` of
    /// one run, in the order it computed them, each recorded only if every
    /// row before it was; waits until they are committed. The outcomes end
    /// at the first row another writer recorded first (the rows after it
    /// are not recorded).
    pub async fn append_chain(
        &self,
        rows: Vec<(StepRow, StepTiming)>,
    ) -> Result<Vec<AppendOutcome>> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::Chain(Chain { rows }, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Store::create_instance`] through the writer.
    pub async fn create(&self, request: CreateRequest) -> Result<(InstanceRow, bool)> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::Create(request, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Store::create_queued`] through the writer: concurrent enqueues
    /// share a commit ([`Store::create_queued_many`]). A refused duplicate
    /// ([`StoreError::Duplicate`]) fails this call alone: the writer then
    /// records the round's enqueues one by one.
    pub async fn create_queued(
        &self,
        request: CreateRequest,
        queued: QueuedRequest,
    ) -> Result<(InstanceRow, bool)> {
        let (reply, answer) = oneshot::channel();
        // Stamped as the call is made: PostgreSQL commits several rounds at
        // once, in whatever order their tasks run, and a queue runs equal
        // priorities in the order their calls were made.
        let created_at = self.clock.creation_stamps(1);
        let create = CreateQueued {
            request,
            queued,
            created_at,
        };
        self.send(Op::CreateQueued(create, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Store::send_message`] through the writer: concurrent sends share a
    /// transaction.
    pub async fn send_message(&self, request: MessageRequest) -> Result<SendOutcome> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::Send(request, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Store::take_messages`] through the writer: concurrent receivers'
    /// takes share a transaction.
    pub async fn take_message(&self, take: Take) -> Result<Taken> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::Take(take, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Store::create_ended`] through the writer: records a new instance
    /// already ended as `finish` says, in one commit (concurrent ones share
    /// it). `false` when the id exists already (left as it is).
    pub async fn create_ended(
        &self,
        request: CreateRequest,
        finish: FinishRequest,
    ) -> Result<(InstanceRow, bool)> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::CreateEnded(CreateEnded { request, finish }, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    /// [`Store::finish`] through the writer.
    pub async fn finish(&self, request: FinishRequest) -> Result<bool> {
        let (applied, _) = self.finish_request(request, None).await?;
        Ok(applied)
    }

    /// [`JournalWriter::finish`] of an instance claimed from a queue that
    /// hands its slot over to the next of its partition in the same commit
    /// (see [`HandOver`]): whether it applied, and the successor now leased
    /// to `request.owner`, which the caller must run (or release).
    pub async fn finish_handing_over(
        &self,
        request: FinishRequest,
        hand_over: HandOver,
    ) -> Result<(bool, Option<InstanceRow>)> {
        self.finish_request(request, Some(hand_over)).await
    }

    /// [`JournalWriter::finish_handing_over`] (or, without a hand-over,
    /// [`JournalWriter::finish`]) with the run's last step rows, committed
    /// in the same transaction (see [`Store::finish_after_steps`]): `false`
    /// when a row was journaled first with another result, and then nothing
    /// of the end applies.
    pub async fn finish_after_steps(
        &self,
        request: FinishRequest,
        hand_over: Option<HandOver>,
        steps: Vec<(StepRow, StepTiming)>,
    ) -> Result<(bool, Option<InstanceRow>)> {
        let (reply, answer) = oneshot::channel();
        let finishing = Finishing {
            request,
            hand_over,
            steps,
        };
        self.send(Op::Finish(finishing, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    async fn finish_request(
        &self,
        request: FinishRequest,
        hand_over: Option<HandOver>,
    ) -> Result<(bool, Option<InstanceRow>)> {
        self.finish_after_steps(request, hand_over, Vec::new())
            .await
    }

    /// [`Store::gc_batch`] through the writer: the batch runs after the
    /// round's workflow writes, so a long gc run takes turns with them (one
    /// batch per round) instead of contending for SQLite's write lock.
    pub async fn gc_batch(&self, request: GcRequest) -> Result<GcProgress> {
        let (reply, answer) = oneshot::channel();
        self.send(Op::Gc(request, reply))?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }

    fn send(&self, op: Op) -> Result<()> {
        self.sender.send(op).map_err(|_| StoreError::WriterStopped)
    }
}

/// The writes of one round, by kind.
#[derive(Default)]
struct Round {
    creates: Pending<CreateRequest, (InstanceRow, bool)>,
    queued_creates: Pending<CreateQueued, (InstanceRow, bool)>,
    created_ended: Pending<CreateEnded, (InstanceRow, bool)>,
    sends: Pending<MessageRequest, SendOutcome>,
    takes: Pending<Take, Taken>,
    steps: Pending<TimedStep, AppendOutcome>,
    /// Chains in layers, no two of one layer of the same run (a run that
    /// lost its lease and its successor, in one process): each layer is one
    /// store call, which then never splits into commits of its own (a call
    /// that failed after some of them committed would be written again
    /// member by member, and the committed chains would meet their own
    /// rows).
    chains: Vec<ChainLayer>,
    finishes: Pending<Finishing, (bool, Option<InstanceRow>)>,
    gcs: Pending<GcRequest, GcProgress>,
}

impl Round {
    /// Files `op` in this round.
    fn add(&mut self, op: Op) {
        match op {
            Op::Create(request, reply) => self.creates.push((request, reply)),
            Op::CreateQueued(request, reply) => self.queued_creates.push((request, reply)),
            Op::CreateEnded(ended, reply) => self.created_ended.push((ended, reply)),
            Op::Send(request, reply) => self.sends.push((request, reply)),
            Op::Take(take, reply) => self.takes.push((take, reply)),
            Op::Step(row, reply) => self.steps.push((row, reply)),
            Op::Steps(rows) => self.steps.extend(rows),
            Op::Chain(chain, reply) => {
                let run = chain
                    .rows
                    .first()
                    .map(|(row, _)| (row.workflow_id.clone(), row.generation));
                let layer = self
                    .chains
                    .iter()
                    .position(|(runs, _)| run.as_ref().is_none_or(|run| !runs.contains(run)));
                let layer = match layer {
                    Some(layer) => layer,
                    None => {
                        self.chains.push(Default::default());
                        self.chains.len() - 1
                    }
                };
                let (runs, pending) = &mut self.chains[layer];
                runs.extend(run);
                pending.push((chain, reply));
            }
            Op::Finish(request, reply) => self.finishes.push((request, reply)),
            Op::Gc(request, reply) => self.gcs.push((request, reply)),
        }
    }

    /// Whether it holds workflow writes (anything but gc batches).
    fn writes_workflows(&self) -> bool {
        !(self.creates.is_empty()
            && self.queued_creates.is_empty()
            && self.created_ended.is_empty()
            && self.sends.is_empty()
            && self.takes.is_empty()
            && self.steps.is_empty()
            && self.chains.is_empty()
            && self.finishes.is_empty())
    }

    /// Commits the round's writes, kind by kind, and answers their callers.
    async fn commit(mut self, store: Store) {
        if !self.creates.is_empty() {
            commit(&store, &mut self.creates).await;
        }
        if !self.queued_creates.is_empty() {
            commit(&store, &mut self.queued_creates).await;
        }
        // After the creates: a message may be for an instance created in
        // the same round.
        if !self.sends.is_empty() {
            commit(&store, &mut self.sends).await;
        }
        if !self.takes.is_empty() {
            commit(&store, &mut self.takes).await;
        }
        if !self.steps.is_empty() {
            commit(&store, &mut self.steps).await;
        }
        for (_, layer) in &mut self.chains {
            commit(&store, layer).await;
        }
        if !self.finishes.is_empty() {
            commit(&store, &mut self.finishes).await;
        }
        if !self.created_ended.is_empty() {
            commit(&store, &mut self.created_ended).await;
        }
        // Last, each in its own transaction: a gc caller sends its next
        // batch only once told about this one, so it never runs two batches
        // in a row while workflow writes wait.
        for (request, reply) in self.gcs.drain(..) {
            let _ = reply.send(store.gc_batch(request).await);
        }
    }
}

/// How many rounds may commit at once on `store`: SQLite has one write
/// lock, so its rounds follow one another; PostgreSQL commits concurrent
/// transactions side by side (and flushes their WAL together), so a write
/// arriving while a round commits starts a round of its own instead of
/// waiting for that one to end.
fn rounds_in_flight(store: &Store) -> usize {
    match store.backend() {
        "postgres" => 4,
        _ => 1,
    }
}

async fn run(store: Store, mut receiver: mpsc::UnboundedReceiver<Op>, rounds: Arc<AtomicU64>) {
    let most = rounds_in_flight(&store);
    let mut committing = tokio::task::JoinSet::new();
    loop {
        // With every slot committing, wait for one to end: the writes that
        // queue meanwhile make the next round.
        if committing.len() >= most {
            let _ = committing.join_next().await;
            continue;
        }
        let first = tokio::select! {
            op = receiver.recv() => match op {
                Some(op) => op,
                None => break,
            },
            Some(_) = committing.join_next(), if !committing.is_empty() => continue,
        };
        let mut round = Round::default();
        round.add(first);
        let mut queued = 1;
        while queued < MAX_BATCH {
            let Ok(op) = receiver.try_recv() else { break };
            round.add(op);
            queued += 1;
        }
        if round.writes_workflows() {
            rounds.fetch_add(1, Ordering::Relaxed);
        }
        committing.spawn(round.commit(store.clone()));
    }
    while committing.join_next().await.is_some() {}
}

type Pending<T, R> = Vec<(T, oneshot::Sender<Result<R>>)>;

/// Chains of a round no two of which are of one run (instance and
/// generation), and those runs.
type ChainLayer = (HashSet<(String, i64)>, Pending<Chain, Vec<AppendOutcome>>);

/// A kind of write the writer batches: how a round of them is committed in
/// one transaction.
trait BatchWrite: Sized {
    /// What each write's caller is told.
    type Outcome;

    /// Commits `members` in one transaction, one outcome per member in order.
    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>>;
}

impl CreateRequest {
    /// Instance `id` of workflow `name` with arguments `input` (JSON), and
    /// nothing else (see [`NewInstance::new`]): recorded `pending` for any
    /// worker. Set the rest with struct update syntax
    /// (`CreateRequest { lease, ..CreateRequest::new(..) }`).
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        input: impl Into<String>,
    ) -> CreateRequest {
        CreateRequest {
            id: id.into(),
            name: name.into(),
            input: input.into(),
            signature: None,
            parent: None,
            lease: None,
            deadline: None,
            traceparent: None,
            app_version: None,
            skeleton_hash: None,
        }
    }

    /// The instance to insert, borrowed.
    fn new_instance(&self) -> NewInstance<'_> {
        NewInstance {
            id: &self.id,
            name: &self.name,
            input: &self.input,
            signature: self.signature.as_deref(),
            parent: self
                .parent
                .as_ref()
                .map(|(id, generation, seq)| ParentLink {
                    id,
                    generation: *generation,
                    seq: *seq,
                }),
            lease: self.lease.as_ref().map(|(owner, ttl_us)| Lease {
                owner,
                ttl_us: *ttl_us,
            }),
            deadline: self.deadline,
            traceparent: self.traceparent.as_deref(),
            app_version: self.app_version.as_deref(),
            skeleton_hash: self.skeleton_hash.as_deref(),
        }
    }
}

impl FinishRequest {
    /// The finish to apply, borrowed.
    fn finish(&self) -> Finish<'_> {
        Finish {
            id: &self.id,
            generation: self.generation,
            owner: &self.owner,
            status: self.status,
            output: self.output.as_deref(),
            error: self.error.as_deref(),
        }
    }
}

impl BatchWrite for CreateRequest {
    type Outcome = (InstanceRow, bool);

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let news: Vec<NewInstance<'_>> = members.iter().map(|r| r.new_instance()).collect();
        store.create_instances(&news).await
    }
}

/// A new instance on a named queue.
#[derive(Debug)]
struct CreateQueued {
    request: CreateRequest,
    queued: QueuedRequest,
    /// Its creation stamp, taken as the call was made.
    created_at: i64,
}

impl BatchWrite for CreateQueued {
    type Outcome = (InstanceRow, bool);

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let batch: Vec<(NewInstance<'_>, Queued<'_>)> = members
            .iter()
            .map(|c| (c.request.new_instance(), c.queued.queued()))
            .collect();
        let stamps: Vec<i64> = members.iter().map(|c| c.created_at).collect();
        store.create_queued_stamped(&batch, &stamps).await
    }
}

/// A new instance with the end its first run reached before it was recorded.
#[derive(Debug)]
struct CreateEnded {
    request: CreateRequest,
    finish: FinishRequest,
}

impl BatchWrite for CreateEnded {
    type Outcome = (InstanceRow, bool);

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let ended: Vec<(NewInstance<'_>, Finish<'_>)> = members
            .iter()
            .map(|e| (e.request.new_instance(), e.finish.finish()))
            .collect();
        store.create_ended(&ended).await
    }
}

impl BatchWrite for MessageRequest {
    type Outcome = SendOutcome;

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let messages: Vec<NewMessage<'_>> = members
            .iter()
            .map(|m| NewMessage {
                workflow_id: &m.workflow_id,
                topic: &m.topic,
                payload: &m.payload,
                type_name: m.type_name.as_deref(),
                idempotency_key: m.idempotency_key.as_deref(),
                journal: m.journal.as_ref(),
            })
            .collect();
        store.send_messages(&messages).await
    }
}

impl BatchWrite for Take {
    type Outcome = Taken;

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let takes: Vec<Take> = members.iter().map(|take| (*take).clone()).collect();
        store.take_messages(&takes).await
    }
}

/// A step row queued with how its body ran.
#[derive(Debug)]
struct TimedStep {
    row: StepRow,
    timing: StepTiming,
}

impl BatchWrite for TimedStep {
    type Outcome = AppendOutcome;

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let rows: Vec<StepRow> = members.iter().map(|step| step.row.clone()).collect();
        let timings: Vec<StepTiming> = members.iter().map(|step| step.timing).collect();
        store.append_timed_steps(&rows, &timings).await
    }
}

/// One run's step rows, in the order it computed them (see
/// [`JournalWriter::append_chain`]).
#[derive(Debug)]
struct Chain {
    rows: Vec<(StepRow, StepTiming)>,
}

impl BatchWrite for Chain {
    type Outcome = Vec<AppendOutcome>;

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let chains: Vec<&[(StepRow, StepTiming)]> =
            members.iter().map(|chain| chain.rows.as_slice()).collect();
        store.append_chains(&chains).await
    }
}

/// A finish queued with the hand-over it makes, if any, and the step rows
/// that commit with it.
#[derive(Debug)]
struct Finishing {
    request: FinishRequest,
    hand_over: Option<HandOver>,
    steps: Vec<(StepRow, StepTiming)>,
}

impl BatchWrite for Finishing {
    type Outcome = (bool, Option<InstanceRow>);

    async fn write(store: &Store, members: &[&Self]) -> Result<Vec<Self::Outcome>> {
        let finishes: Vec<Finish<'_>> = members.iter().map(|f| f.request.finish()).collect();
        let hand_overs: Vec<Option<&HandOver>> =
            members.iter().map(|f| f.hand_over.as_ref()).collect();
        let steps: Vec<&[(StepRow, StepTiming)]> =
            members.iter().map(|f| f.steps.as_slice()).collect();
        store
            .finish_after_steps(&finishes, &hand_overs, &steps)
            .await
    }
}

/// Commits `batch` in one transaction through `write` and hands each waiter
/// its outcome.
///
/// When the shared transaction fails with a permanent error (a value the
/// database refuses, say), it was rolled back whole (or, for SQLite's ends
/// committed ahead of the rest, a member that applied reports on its retry
/// that it did not, as after a lost answer; see
/// `Store::finish_handing_over`), so one bad write would
/// fail every unrelated write that happened to share its round. Each member
/// is then written again alone: only the writes the database refuses by
/// themselves report an error. A transient error (connection lost, database
/// busy) fails the whole batch: writing the members one by one would meet the
/// same fault, and every caller retries anyway.
async fn commit<T: BatchWrite>(store: &Store, batch: &mut Pending<T, T::Outcome>) {
    let members: Vec<&T> = batch.iter().map(|(request, _)| request).collect();
    let result = T::write(store, &members).await;
    drop(members);
    let error = match result {
        Err(error) if batch.len() > 1 && !error.is_transient() => error,
        result => return reply_all(batch, result),
    };
    tracing::warn!(
        %error,
        writes = batch.len(),
        "keiro write batch refused; writing its members one by one"
    );
    for (request, reply) in batch.drain(..) {
        let outcome = T::write(store, &[&request]).await.and_then(|mut one| {
            one.pop().ok_or_else(|| StoreError::Corrupt {
                what: "a write of one member returned no outcome".into(),
            })
        });
        let _ = reply.send(outcome);
    }
}

/// Hands each waiter its outcome, or the batch's error.
fn reply_all<T, R>(batch: &mut Pending<T, R>, result: Result<Vec<R>>) {
    match result {
        Ok(outcomes) => {
            for ((_, reply), outcome) in batch.drain(..).zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            tracing::warn!(%error, writes = batch.len(), "keiro write batch failed");
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
