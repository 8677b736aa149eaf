//! Durable select: a race over keiro futures whose winner is journaled, so
//! every replay takes the same branch (`keiro::select!` expands to this).
//!
//! The decision takes its own step id, claimed before the branches are
//! built (each branch claims its ids when built, so the order is fixed). A
//! replay that finds the decision awaits only the winner, whose own rows
//! replay it; the losers are dropped unpolled. A first run polls every
//! branch in order and journals the index of the first to complete.
//!
//! A branch that would suspend the workflow (a long sleep, an unanswered
//! awakeable, an empty topic) only files its wake condition here and keeps
//! waiting in memory; the run suspends when every branch has filed one, with
//! all of them merged, so it is due again at the first one.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use keiro_store::StepRow;

use super::{claim_seq, halt, record, step::replay, Halt, StepKind, WorkflowContext};
use crate::runtime::lock;
use crate::Error;

/// One branch of a select, ready to poll.
pub type BranchFuture<'a, O> = Pin<Box<dyn Future<Output = O> + Send + 'a>>;

/// A keiro future: a race over it can be journaled, so a replay takes the
/// same branch. `keiro::select!` accepts only these.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a keiro future, so `keiro::select!` cannot race it durably",
    label = "only keiro futures can race durably: make it a #[step]",
    note = "`keiro::select!` races #[step] calls, `keiro::sleep`, awakeables, `keiro::recv`, \
            child workflow calls and `ChildHandle`s; other work belongs in a #[step]"
)]
pub trait Durable {}

/// What wakes a suspended run: a time, recorded steps, waiting messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Wake {
    /// When it is due by time (µs since the Unix epoch), if ever.
    pub(crate) wake_at: Option<i64>,
    /// Steps whose recording makes it due.
    pub(crate) steps: Vec<i64>,
    /// Topics where a message makes it due.
    pub(crate) topics: Vec<String>,
    /// What it waits on, as listings show it: the first branch's wait.
    pub(crate) waiting: Option<keiro_store::WaitingStep>,
}

impl Wake {
    /// The wake condition of a suspension request, if `halt` is one.
    fn of(halt: &Halt) -> Option<Wake> {
        match halt {
            Halt::Suspend {
                wake_at,
                awaiting,
                topic,
                waiting,
            } => Some(Wake {
                wake_at: *wake_at,
                steps: awaiting.iter().copied().collect(),
                topics: topic.iter().cloned().collect(),
                waiting: waiting.clone(),
            }),
            Halt::SuspendAny(wake) => Some(wake.clone()),
            _ => None,
        }
    }

    /// Due at the first of `self` and `other`.
    fn merge(mut self, other: Wake) -> Wake {
        self.waiting = self.waiting.or(other.waiting);
        self.wake_at = match (self.wake_at, other.wake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for step in other.steps {
            if !self.steps.contains(&step) {
                self.steps.push(step);
            }
        }
        for topic in other.topics {
            if !self.topics.contains(&topic) {
                self.topics.push(topic);
            }
        }
        self
    }
}

/// The wake conditions the branches of one select have filed, by index.
type Filed = Arc<Mutex<Vec<Option<Wake>>>>;

/// The branch being polled, while a select polls it.
#[derive(Clone)]
struct Branch {
    filed: Filed,
    index: usize,
    decision: Decision,
}

/// A select's decision while its branches run: a winning step journals it
/// with its own row ([`claim_win`]), saving the select a commit.
#[derive(Clone)]
struct Decision {
    cx: Arc<WorkflowContext>,
    seq: i64,
    state: Arc<Mutex<Claim>>,
}

/// Which branch claimed the win, and the winner then journaled.
#[derive(Debug, Default)]
struct Claim {
    by: Option<usize>,
    journaled: Option<u32>,
    /// Losing transactional steps waiting to learn the journaled winner
    /// ([`Lost::decided`]).
    waiting: Vec<std::task::Waker>,
}

impl Claim {
    /// Records the winner the journal holds, and wakes the losers waiting.
    fn journal(&mut self, winner: u32) {
        self.journaled = Some(winner);
        self.wake();
    }

    /// Wakes the losers waiting.
    fn wake(&mut self) {
        for waker in self.waiting.drain(..) {
            waker.wake();
        }
    }
}

/// The win a step completing in a select's branch claims for it: the
/// decision's step id and the branch's index, to journal with the step's
/// row; [`Won::journaled`] reports the winner the journal then holds.
pub(crate) struct Won {
    /// The decision's step id.
    pub(crate) seq: i64,
    /// The claiming branch's index.
    pub(crate) index: u32,
    state: Arc<Mutex<Claim>>,
}

impl Won {
    /// Tells the select which winner the journal holds (the claimed one, or
    /// one another executor journaled first).
    pub(crate) fn journaled(self, winner: u32) {
        lock(&self.state).journal(winner);
    }

    /// Gives the win back, unjournaled: the claiming step failed an attempt
    /// and waits to retry it, and another branch may win meanwhile (a
    /// losing transactional step waiting runs again).
    pub(crate) fn release(self) {
        let mut claim = lock(&self.state);
        if claim.journaled.is_none() && claim.by == Some(self.index as usize) {
            claim.by = None;
            claim.wake();
        }
    }
}

/// What a losing transactional step learns while it waits
/// ([`Lost::decided`]).
pub(crate) enum Verdict {
    /// The journal names its branch the winner after all (another executor
    /// decided the select first): it runs to its result.
    Named,
    /// The branch that claimed the win gave it back: the step runs again,
    /// and may win.
    Reopened,
}

/// A step completing in a select's branch after another branch claimed the
/// win: a transactional step then rolls its writes back instead of
/// committing them, since the workflow goes on down the winner's branch.
pub(crate) struct Lost {
    index: u32,
    state: Arc<Mutex<Claim>>,
}

impl Lost {
    /// Returns once the journal holds this branch as the winner, or the
    /// win is given back unjournaled; pending for good once another branch
    /// is journaled, until the select drops the branch.
    pub(crate) async fn decided(self) -> Verdict {
        std::future::poll_fn(|task| {
            let mut claim = lock(&self.state);
            match (claim.journaled, claim.by) {
                (Some(winner), _) if winner == self.index => Poll::Ready(Verdict::Named),
                (Some(_), _) => Poll::Pending,
                (None, None) => Poll::Ready(Verdict::Reopened),
                (None, Some(_)) => {
                    if !claim.waiting.iter().any(|w| w.will_wake(task.waker())) {
                        claim.waiting.push(task.waker().clone());
                    }
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// A step of workflow `cx` completing inside a select's branch, while no
/// other branch has claimed the win: the win, for the step to journal the
/// decision with its own row. `None` elsewhere.
pub(crate) fn claim_win(cx: &Arc<WorkflowContext>) -> Option<Won> {
    let branch = BRANCH.try_with(Branch::clone).ok()?;
    let decision = branch.decision;
    if !Arc::ptr_eq(&decision.cx, cx) {
        return None;
    }
    let mut claim = lock(&decision.state);
    if claim.by.is_some() {
        return None;
    }
    claim.by = Some(branch.index);
    Some(Won {
        seq: decision.seq,
        index: u32::try_from(branch.index).ok()?,
        state: decision.state.clone(),
    })
}

/// A step of workflow `cx` completing inside a select's branch after another
/// branch claimed the win: that loss. `None` elsewhere.
pub(crate) fn lost(cx: &Arc<WorkflowContext>) -> Option<Lost> {
    let branch = BRANCH.try_with(Branch::clone).ok()?;
    let decision = branch.decision;
    if !Arc::ptr_eq(&decision.cx, cx) {
        return None;
    }
    let by = lock(&decision.state).by?;
    (by != branch.index).then(|| Lost {
        index: u32::try_from(branch.index).unwrap_or(u32::MAX),
        state: decision.state.clone(),
    })
}

tokio::task_local! {
    static BRANCH: Branch;
}

/// Inside a select's branch, files a suspension request with the select
/// instead of suspending the run; `None` then, and the branch may keep
/// waiting in memory (the waits do: a branch that has filed still wins if
/// what it waits for comes before the others have filed too). Anything else
/// passes through.
pub(crate) fn intercept(halt: Halt) -> Option<Halt> {
    let Some(wake) = Wake::of(&halt) else {
        return Some(halt);
    };
    match BRANCH.try_with(Branch::clone) {
        Ok(branch) => {
            lock(&branch.filed)[branch.index] = Some(wake);
            None
        }
        Err(_) => Some(halt),
    }
}

/// A select whose decision id is claimed (inside a workflow).
#[must_use = "a select does nothing until it is run"]
pub struct Select {
    slot: Option<(Arc<WorkflowContext>, i64)>,
}

impl std::fmt::Debug for Select {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seq = self.slot.as_ref().map(|(_, seq)| *seq);
        f.debug_struct("Select").field("seq", &seq).finish()
    }
}

impl Select {
    /// Claims the decision's step id: call it before building the branches.
    pub fn begin() -> Select {
        Select { slot: claim_seq() }
    }

    /// A select deciding at step `seq` of `cx`.
    pub(crate) fn at(cx: Arc<WorkflowContext>, seq: i64) -> Select {
        Select {
            slot: Some((cx, seq)),
        }
    }

    /// Runs the race: the journaled winner on replay, else the first branch
    /// to complete (journaled before its output is returned). Outside a
    /// workflow, a plain race in order.
    pub async fn run<O>(self, branches: Vec<BranchFuture<'_, O>>) -> O {
        self.race(branches).await.1
    }

    /// Like [`Select::run`], with the winner's index.
    pub(crate) async fn race<O>(self, mut branches: Vec<BranchFuture<'_, O>>) -> (usize, O) {
        let Some((cx, seq)) = self.slot else {
            return first_of(&mut branches, None).await;
        };
        if let Some(row) = cx.recorded(seq) {
            let winner = decided(&cx, seq, &row, branches.len()).await;
            let future = branches.swap_remove(winner);
            drop(branches);
            return (winner, future.await);
        }
        let filed: Filed = Arc::new(Mutex::new(vec![None; branches.len()]));
        let decision = Decision {
            cx: cx.clone(),
            seq,
            state: Arc::default(),
        };
        let watch = Watch {
            filed: &filed,
            decision: &decision,
        };
        let (first, output) = first_of(&mut branches, Some(watch)).await;
        let index = u32::try_from(first).unwrap_or(u32::MAX);
        let claimed = {
            let claim = lock(&decision.state);
            claim.journaled.filter(|_| claim.by == Some(first))
        };
        let mut finished: Vec<Option<O>> = branches.iter().map(|_| None).collect();
        let recorded: u32 = match claimed {
            // The winning step journaled the decision with its own row.
            Some(recorded) => recorded,
            None => {
                // No branch claims the win from here on, and while the
                // decision is written a transactional step among the others
                // is polled to its end: it holds its transaction open (on
                // SQLite the only write lock, which the decision's write
                // waits for) until then, and then, having lost, rolls its
                // writes back (see [`lost`]).
                // (Over a claim a step made and has not journaled: that
                // step commits with its claim, and the journal decides
                // between the two; a claim given back is none.)
                lock(&decision.state).by = Some(first);
                let write = record(&cx, seq, StepKind::Select, NAME, index);
                let recorded = alongside(write, &mut branches, first, &mut finished, watch).await;
                lock(&decision.state).journal(recorded);
                recorded
            }
        };
        if recorded == index {
            return (first, output);
        }
        // Another executor journaled another winner first: its branch stands.
        let winner = recorded as usize;
        if winner >= branches.len() {
            return halt(
                &cx,
                Halt::Error(out_of_range(&cx, seq, winner, branches.len())),
            )
            .await;
        }
        drop(output);
        if let Some(done) = finished.swap_remove(winner) {
            return (winner, done);
        }
        let future = branches.swap_remove(winner);
        drop(branches);
        (winner, future.await)
    }
}

/// Awaits `write`, polling meanwhile, while a transactional step of the run
/// holds its transaction open, every branch but `won` that has not
/// finished, and keeping what each that finishes returns in `finished`.
/// Only then: a losing branch polled on could take what the winner's does
/// not need (a message a `recv` consumes), so the others wait as before.
async fn alongside<O, T>(
    write: impl Future<Output = T>,
    branches: &mut [BranchFuture<'_, O>],
    won: usize,
    finished: &mut [Option<O>],
    watch: Watch<'_>,
) -> T {
    let mut write = std::pin::pin!(write);
    std::future::poll_fn(|task| {
        if let Poll::Ready(written) = write.as_mut().poll(task) {
            return Poll::Ready(written);
        }
        if !watch.decision.cx.in_transaction() {
            return Poll::Pending;
        }
        for (index, branch) in branches.iter_mut().enumerate() {
            if index == won || finished[index].is_some() {
                continue;
            }
            let scope = Branch {
                filed: watch.filed.clone(),
                index,
                decision: watch.decision.clone(),
            };
            if let Poll::Ready(output) = BRANCH.sync_scope(scope, || branch.as_mut().poll(task)) {
                finished[index] = Some(output);
            }
        }
        Poll::Pending
    })
    .await
}

/// Waits for `wait` until `when` at most: `None` when `when` passes first.
/// The deadline is journaled at step `seq` when this first runs (a replay
/// keeps the first run's), and which came first at `seq + 1`, so a replay
/// gives the same answer whatever the clock says now.
pub(crate) async fn with_deadline<T: Send>(
    cx: Arc<WorkflowContext>,
    seq: i64,
    when: std::time::SystemTime,
    wait: impl Future<Output = T> + Send,
) -> Option<T> {
    let (kind, name) = (StepKind::Sleep, "timeout deadline");
    let deadline: i64 = match cx.recorded(seq) {
        Some(row) => replay(&cx, seq, kind, name, &row).await,
        None => record(&cx, seq, kind, name, crate::time::to_us(when)).await,
    };
    let expiry = cx.clone();
    let branches: Vec<BranchFuture<'_, Option<T>>> = vec![
        Box::pin(async move { Some(wait.await) }),
        Box::pin(async move {
            super::sleep::wait_until(&expiry, seq, name, deadline).await;
            None
        }),
    ];
    Select::at(cx, seq + 1).race(branches).await.1
}

/// The journaled name of a select's decision.
const NAME: &str = "select";

/// What a select inside a workflow shares with its branches.
#[derive(Clone, Copy)]
struct Watch<'a> {
    filed: &'a Filed,
    decision: &'a Decision,
}

/// Polls `branches` in order until one completes. Inside a workflow
/// (`watch` given), a branch asking to suspend files its wake condition, and
/// the run suspends once every branch has, on all of them.
async fn first_of<O>(branches: &mut [BranchFuture<'_, O>], watch: Option<Watch<'_>>) -> (usize, O) {
    let mut suspended = false;
    std::future::poll_fn(|task| {
        for (index, branch) in branches.iter_mut().enumerate() {
            let polled = match &watch {
                None => branch.as_mut().poll(task),
                Some(watch) => {
                    let scope = Branch {
                        filed: watch.filed.clone(),
                        index,
                        decision: watch.decision.clone(),
                    };
                    BRANCH.sync_scope(scope, || branch.as_mut().poll(task))
                }
            };
            if let Poll::Ready(output) = polled {
                return Poll::Ready((index, output));
            }
        }
        if let Some(Watch { filed, decision }) = &watch {
            let cx = &decision.cx;
            if !suspended {
                let merged = lock(filed)
                    .iter()
                    .cloned()
                    .try_fold(Wake::default(), |all, one| Some(all.merge(one?)));
                if let Some(wake) = merged {
                    suspended = true;
                    // Through the routing: a select inside another's branch
                    // files the merged request with the outer one.
                    cx.halt(Halt::SuspendAny(wake));
                }
            }
        }
        Poll::Pending
    })
    .await
}

/// The winner journaled at step `seq`, checked against the code's branches.
async fn decided(cx: &Arc<WorkflowContext>, seq: i64, row: &StepRow, branches: usize) -> usize {
    let winner: u32 = replay(cx, seq, StepKind::Select, NAME, row).await;
    let winner = winner as usize;
    if winner >= branches {
        return halt(cx, Halt::Error(out_of_range(cx, seq, winner, branches))).await;
    }
    winner
}

fn out_of_range(cx: &WorkflowContext, seq: i64, winner: usize, branches: usize) -> Error {
    Error::NonDeterministic {
        name: cx.name.clone(),
        id: cx.id.clone(),
        seq,
        expected: format!("keiro::select! whose branch {winner} won"),
        found: format!("keiro::select! with {branches} branches"),
    }
}

/// Wraps a branch's future so every branch of a select has one output type;
/// only keiro futures ([`Durable`]) are accepted.
pub fn branch<'a, D, O>(durable: D, wrap: fn(D::Output) -> O) -> BranchFuture<'a, O>
where
    D: Durable + IntoFuture,
    D::IntoFuture: Send + 'a,
    D::Output: 'a,
    O: 'a,
{
    let future = durable.into_future();
    Box::pin(async move { wrap(future.await) })
}

/// A boxed keiro future: what `#[step]` calls and `keiro::sleep` return.
#[must_use = "futures do nothing unless awaited"]
pub struct DurableFuture<T>(BoxFuture<T>);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<T> DurableFuture<T> {
    /// Wraps `future`, one of keiro's own.
    pub(crate) fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        DurableFuture(Box::pin(future))
    }

    /// Wraps an already boxed `future`: what `#[step]` expands to.
    #[doc(hidden)]
    pub fn boxed(future: BoxFuture<T>) -> Self {
        DurableFuture(future)
    }
}

impl<T> std::fmt::Debug for DurableFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DurableFuture")
    }
}

impl<T> Future for DurableFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, task: &mut std::task::Context<'_>) -> Poll<T> {
        self.0.as_mut().poll(task)
    }
}

impl<T> Durable for DurableFuture<T> {}

#[cfg(test)]
mod tests {
    use super::Wake;

    #[test]
    fn merged_wake_conditions_are_due_at_the_first() {
        let sleep = Wake {
            wake_at: Some(50),
            ..Wake::default()
        };
        let answer = Wake {
            steps: vec![3],
            ..Wake::default()
        };
        let earlier = Wake {
            wake_at: Some(20),
            topics: vec!["t".into()],
            ..Wake::default()
        };
        let merged = sleep.merge(answer).merge(earlier);
        assert_eq!(
            merged,
            Wake {
                wake_at: Some(20),
                steps: vec![3],
                topics: vec!["t".into()],
                waiting: None,
            }
        );
    }
}
