//! Running a `#[step(transaction)]`: its body runs in a [`Transaction`] on
//! keiro's database, and its journal row is written in that transaction, so
//! the application's writes and the step's result commit together.
//!
//! - Replay returns the journaled result without opening a transaction. A
//!   replay without side effects (`keiro::testing::replay`, `Keiro::check`)
//!   stops at an unjournaled one, as at a plain step: the body never runs.
//! - `Ok`: the row is written in the body's transaction, which then commits.
//!   If another executor journaled the step first (the primary key says so;
//!   on PostgreSQL the insert waits for that executor's transaction), this
//!   one rolls back, application writes included, and the recorded result
//!   stands.
//! - In a branch of a `keiro::select!` that another branch won while the
//!   body ran, a body returning `Ok` has its writes rolled back instead of
//!   committed, and nothing is journaled: the workflow goes on down the
//!   winner's branch, as if the step had never run. (Should the journal
//!   name its branch after all, another executor having decided first, it
//!   runs again to its result; should the winner give its claim back, a
//!   failed attempt waiting to retry, it runs again and may win.)
//! - `Err`: the application's writes roll back; the step is retried per
//!   `max_attempts`, and the final `Err` is journaled like any step's,
//!   through the group-commit writer.
//! - A conflict keiro meets itself (beginning, writing the row, committing:
//!   a serialization failure, a deadlock, SQLite BUSY), one a statement of
//!   the body meets on the [`crate::TxConnection`] (whatever the body then
//!   returned), or a transient error such as a connection lost under the
//!   body (its `Err` then is not the step's outcome), rolls back and runs
//!   the body again in a new transaction, without counting against
//!   `max_attempts`; after `MAX_CONFLICTS` in a row the run stops and is
//!   resumed later.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use keiro_store::{StepTiming, StoreError};
use serde::{de::DeserializeOwned, Serialize};
use tracing::Instrument;

use super::select::{claim_win, Verdict, Won};
use super::step::{
    checked_lease, encode_result, halt, record_step, replay, replay_taken_in, step_row, StepMeta,
};
use super::{claim_seq, scope, StepKind, WorkflowContext};
use crate::{Error, Keiro, Transaction};

/// How many conflicts in a row one step gets past before its run stops
/// with the last one (and is resumed later, from the journal).
const MAX_CONFLICTS: u32 = 50;

/// How much longer than a `timeout_ms` step's attempt one statement of its
/// body may run on PostgreSQL (see `StepTx::limit_statements`).
const STATEMENT_GRACE_MS: u64 = 100;

/// How long a body may hold SQLite's write lock before keiro warns: every
/// other write to the database (other workflows' steps and ends, lease
/// renewals, timers) waits that long.
const SLOW_LOCK: Duration = Duration::from_secs(1);

/// How long a body may hold SQLite's write lock, still running, before
/// keiro warns without waiting for it to return (and again each time the
/// hold doubles): a body stuck on a call that never answers stops every
/// write to the database, and would otherwise never be named.
const STUCK_LOCK: Duration = Duration::from_secs(3);

/// How long a body may keep its PostgreSQL transaction open, still running,
/// before keiro warns (and again each time that doubles): its connection is
/// out of the pool, and any rows it wrote or locked stay locked against
/// other writers, for as long as it runs.
const STUCK_TRANSACTION: Duration = Duration::from_secs(5);

/// Runs a `#[step(transaction)]`: `body` runs in a transaction on keiro's
/// database, rolled back when `is_err` says the attempt failed, and a failed
/// attempt is retried when `retry` says so, up to `meta.max_attempts` times
/// in all; a run whose statement lost a race with a concurrent transaction
/// runs again outside that count. Inside a workflow the step id is
/// allocated now, at the call, and the result is journaled in the body's
/// transaction; outside one the body runs in a transaction of the
/// process-wide runtime, committed on success.
///
/// Called inside another transactional step's body it panics, naming both:
/// a body runs in one transaction, and a second one would wait for it
/// forever (SQLite's one write lock) or commit apart from it (PostgreSQL).
pub fn step_transaction<R, B>(
    meta: StepMeta,
    is_err: impl Fn(&R) -> bool + Send + 'static,
    retry: impl Fn(&R) -> bool + Send + 'static,
    body: B,
) -> impl Future<Output = R> + Send
where
    R: Serialize + DeserializeOwned + Send + 'static,
    B: for<'t> FnMut(&'t mut Transaction<'static>) -> Pin<Box<dyn Future<Output = R> + Send + 't>>
        + Send
        + 'static,
{
    if let Ok(outer) = IN_BODY.try_with(|outer| *outer) {
        panic!(
            "transactional step `{}` was called inside the body of transactional step \
             `{outer}`: a body runs in one transaction, and a second would wait for it \
             (SQLite) or commit apart from it (PostgreSQL). Make `{}` a plain async fn \
             taking `&mut keiro::Transaction<'_>` and call it with the outer step's `tx`, \
             or call the two steps one after the other from the workflow",
            meta.name, meta.name
        );
    }
    let slot = claim_seq();
    // Outside a workflow's context, yet inside a journaled step's body (a
    // workflow awaited from a step body runs in its own context: its steps
    // are journaled, and pass here with a slot).
    if slot.is_none() {
        if let Ok(super::step::StepName(outer)) = super::step::IN_STEP.try_with(|outer| *outer) {
            panic!(
                "transactional step `{}` was called inside the body of step `{outer}`, which runs \
                 outside its workflow's journal: `{}` would commit with no journal row, and again \
                 at each retry or re-run of `{outer}`. Call `{}` from the workflow, before or \
                 after `{outer}`",
                meta.name, meta.name, meta.name
            );
        }
    }
    let step = TxStep {
        meta,
        is_err,
        retry,
        body,
    };
    async move {
        match slot {
            None => step.outside().await,
            Some((cx, seq)) => step.journaled(cx, seq).await,
        }
    }
}

tokio::task_local! {
    /// The transactional step whose body the task is running.
    static IN_BODY: &'static str;
}

/// A transactional step being run.
struct TxStep<F, G, B> {
    meta: StepMeta,
    /// Whether an attempt failed (its writes roll back).
    is_err: F,
    /// Whether a failed attempt may be retried.
    retry: G,
    body: B,
}

/// How one attempt in a transaction ended.
enum Attempt<R> {
    /// The body returned `Ok`; the transaction is still open.
    Done(R, Transaction<'static>),
    /// The body returned `Err`; the transaction was rolled back.
    Failed(R),
}

impl<R, F, G, B> TxStep<F, G, B>
where
    R: Serialize + DeserializeOwned + Send + 'static,
    F: Fn(&R) -> bool,
    G: Fn(&R) -> bool,
    B: for<'t> FnMut(&'t mut Transaction<'static>) -> Pin<Box<dyn Future<Output = R> + Send + 't>>,
{
    /// Opens a transaction on `keiro`'s database and runs the body in it
    /// (with no workflow context, so nothing inside is journaled); rolls
    /// back on `Err`, and on a conflict a statement of the body met, which
    /// it returns as [`StoreError::Conflict`]. `run` names the workflow
    /// instance it runs in, if any.
    async fn attempt(
        &mut self,
        keiro: &Keiro,
        run: Option<&WorkflowContext>,
    ) -> Result<Attempt<R>, StoreError> {
        let mut tx = Transaction::new(keiro.raw_store().begin_step_tx().await?);
        if let Some(ms) = self.meta.timeout_ms {
            // The attempt's own limit, and a little more: the runtime drops
            // an attempt out of time first (its `Err` is the step timeout),
            // and the rollback then waits at most this for the statement it
            // left running.
            tx.inner()
                .limit_statements(ms.saturating_add(STATEMENT_GRACE_MS))
                .await?;
        }
        let began = std::time::Instant::now();
        let sqlite = keiro.raw_store().backend() == "sqlite";
        let of = || {
            run.map_or_else(String::new, |cx| {
                format!(" of workflow `{}` id `{}`", cx.name, cx.id)
            })
        };
        let body = IN_BODY.scope(self.meta.name, scope(None, (self.body)(&mut tx)));
        // Boxed: the compiler cannot tell this future is `Send` for every
        // lifetime of the body's borrow when it goes through a generic
        // function unboxed.
        let value = warn_while_stuck(Box::pin(body), began, sqlite, self.meta.name, &of).await;
        let held = began.elapsed();
        if held >= SLOW_LOCK && sqlite {
            let of = of();
            tracing::warn!(
                step = self.meta.name,
                held_ms = held.as_millis() as u64,
                "keiro transactional step `{}`{of} held SQLite's only write lock for {held:?} \
                 while its body ran: every other write to the database waited (other \
                 workflows' steps, lease renewals, timers). Keep the body to its database \
                 writes and do slow work (network calls) in a plain step before or after it",
                self.meta.name
            );
        }
        // A statement of the body lost a race with a concurrent transaction
        // (and none got past it since): on PostgreSQL the transaction is
        // aborted, and the body's outcome, likely that error, is no outcome
        // of the step. It runs again, like a conflict keiro meets itself.
        let conflict = tx.take_conflict();
        if conflict.is_none() && !(self.is_err)(&value) {
            return Ok(Attempt::Done(value, tx));
        }
        // A body that committed and then failed (or met a conflict) must not
        // run again. (A transaction a failed statement aborted is still
        // open: the check fails otherwise there, and it rolls back below.)
        // Nor one whose transaction rolled back under it, unless SQLite
        // rolled it back itself at the body's last statement: what the body
        // ran after a rollback committed on its own.
        if let Some(error) = ended_under_body(&mut tx).await {
            return Err(error);
        }
        if let Err(error) = tx.into_inner().rollback().await {
            if error.is_transient() {
                // The connection was lost under the body: its `Err` may be
                // that loss rather than the step's outcome. Nothing
                // committed, so the body runs again in a new transaction.
                return Err(error);
            }
            // Dropping the connection rolls the transaction back all the same.
            tracing::debug!(step = self.meta.name, %error, "keiro transactional step rollback failed");
        }
        if let Some(reason) = conflict {
            return Err(StoreError::Conflict {
                step: self.meta.name,
                reason,
            });
        }
        Ok(Attempt::Failed(value))
    }

    /// The step inside a workflow: replayed, or run with its result
    /// journaled in its own transaction.
    async fn journaled(mut self, cx: Arc<WorkflowContext>, seq: i64) -> R {
        let name = self.meta.name;
        if let Some(recorded) = cx.recorded(seq) {
            let span = tracing::debug_span!("keiro.step", name, seq, replayed = true);
            crate::telemetry::step(name, true);
            return replay(&cx, seq, StepKind::Step, name, &recorded)
                .instrument(span)
                .await;
        }
        // A replay without side effects stops here, like at a plain step:
        // the body would run, and on the replay's private database.
        if cx.replay_only {
            return super::beyond_history(&cx).await;
        }
        let span = tracing::debug_span!(
            "keiro.step",
            name,
            seq,
            replayed = false,
            transaction = true
        );
        async move {
            let started_at = cx.keiro.now_us();
            let max = self.meta.max_attempts.max(1);
            let (mut runs, mut attempt, mut conflicts) = (0, 1, 0);
            let mut won: Option<Won> = None;
            // Whether the journal names this step's branch the winner of the
            // select it lost here: it then runs to its result after all.
            let mut named = false;
            // Its row commits in the application's transaction: after the
            // rows a pipelined run queued before it.
            super::pipeline::barrier(&cx).await;
            if let Some(recorded) = checked_lease(&cx, seq).await {
                return replay_taken_in(&cx, seq, StepKind::Step, name, &recorded).await;
            }
            loop {
                if cx.deadline_passed() {
                    // No attempt begins past the run's deadline: its driver
                    // ends the run.
                    return cx.stop_at_deadline().await;
                }
                runs += 1;
                let timing = StepTiming {
                    attempts: Some(runs),
                    started_at: Some(started_at),
                };
                // Only while the transaction is open: not over the waits
                // between attempts, where nothing holds a renewal up.
                let open = cx.enter_transaction();
                let error = match self.attempt(&cx.keiro, Some(&cx)).await {
                    Ok(Attempt::Failed(value)) if attempt < max && (self.retry)(&value) => {
                        drop(open);
                        // A win claimed on an earlier run (kept over a
                        // conflict) goes back while this waits to retry:
                        // another branch may win meanwhile. One another
                        // branch won waits for the decision first.
                        if let Some(won) = won.take() {
                            won.release();
                        }
                        if let Some(lost) = super::select::lost(&cx).filter(|_| !named) {
                            named = matches!(lost.decided().await, Verdict::Named);
                        }
                        self.meta.wait_before_retry(attempt).await;
                        // The next attempt, like the first, starts on a
                        // lease checked after a hold-up.
                        if let Some(recorded) = checked_lease(&cx, seq).await {
                            return replay_taken_in(&cx, seq, StepKind::Step, name, &recorded).await;
                        }
                        attempt += 1;
                        // Conflicts count in a row: this run met none.
                        conflicts = 0;
                        continue;
                    }
                    Ok(Attempt::Failed(value)) => {
                        drop(open);
                        let won = won.take().or_else(|| claim_win(&cx));
                        return record_step(&cx, seq, StepKind::Step, name, value, timing, won)
                            .await;
                    }
                    Ok(Attempt::Done(value, mut tx)) => {
                        // Claimed once: a retry after a conflict keeps the claim.
                        if won.is_none() {
                            won = claim_win(&cx);
                        }
                        match super::select::lost(&cx).filter(|_| won.is_none() && !named) {
                            // Another branch of the select won while the body
                            // ran: the workflow goes on down that branch, so
                            // these writes roll back instead of committing.
                            Some(lost) => {
                                drop(value);
                                if let Err(ended) = roll_back(&cx, seq, name, tx).await {
                                    return halt(&cx, ended).await;
                                }
                                drop(open);
                                named = matches!(lost.decided().await, Verdict::Named);
                                continue;
                            }
                            // The run's deadline passed while the body
                            // ran: its driver is ending the run as timed
                            // out (on SQLite that waits for the write lock
                            // this transaction holds). The writes roll
                            // back, as they do on PostgreSQL, where the end
                            // commits at once and drops the body, and the
                            // workflow goes no further.
                            None if cx.deadline_passed() => {
                                drop(value);
                                if let Err(ended) = roll_back(&cx, seq, name, tx).await {
                                    return halt(&cx, ended).await;
                                }
                                drop(open);
                                return cx.stop_at_deadline().await;
                            }
                            None => {
                                let failed = tx.take_failed();
                                match commit(&cx, seq, name, value, tx, timing, &mut won).await {
                                    Ok(value) => return value,
                                    Err(error) => naming_failed(error, failed),
                                }
                            }
                        }
                    }
                    Err(error) => error,
                };
                drop(open);
                let again = error.is_conflict() || error.is_transient();
                if !again || conflicts >= MAX_CONFLICTS {
                    return halt(&cx, step_error(&cx, seq, name, error)).await;
                }
                conflicts += 1;
                tracing::debug!(step = name, conflicts, %error, "keiro transactional step conflicted; retrying");
                tokio::time::sleep(conflict_pause(conflicts)).await;
            }
        }
        .instrument(span)
        .await
    }

    /// The step outside a workflow: run in a transaction of the process-wide
    /// runtime, committed on `Ok`, nothing journaled.
    async fn outside(mut self) -> R {
        let name = self.meta.name;
        let fail = |error: &dyn std::fmt::Display| -> ! {
            panic!(
                "`#[step(transaction)]` `{name}`, called outside a workflow, could not run in a \
                 transaction on keiro's database: {error}"
            )
        };
        let keiro = match crate::global().await {
            Ok(keiro) => keiro,
            Err(error) => fail(&error),
        };
        let max = self.meta.max_attempts.max(1);
        let (mut attempt, mut conflicts) = (1, 0);
        loop {
            // Whether the attempt may run again: nothing of it committed. A
            // conflict or a transient error before the COMMIT says so; after
            // it only a conflict does (a transient one, a lost connection or
            // a server shutting down, may come after the COMMIT took
            // effect, and outside a workflow nothing journals what it did).
            let (error, again) = match self.attempt(&keiro, None).await {
                Ok(Attempt::Failed(value)) if attempt < max && (self.retry)(&value) => {
                    self.meta.wait_before_retry(attempt).await;
                    attempt += 1;
                    conflicts = 0;
                    continue;
                }
                Ok(Attempt::Failed(value)) => return value,
                Ok(Attempt::Done(value, tx)) => {
                    let mut tx = tx.into_inner();
                    match tx.check_open().await {
                        Ok(()) => match tx.commit().await {
                            Ok(()) => return value,
                            Err(error) if error.is_transient() && !error.is_conflict() => panic!(
                                "`#[step(transaction)]` `{name}`, called outside a workflow, \
                                 sent its COMMIT and got no clear answer ({error}): its writes \
                                 may or may not have committed, and outside a workflow nothing \
                                 journals them; call it from a workflow to have it take effect \
                                 exactly once"
                            ),
                            Err(error) => {
                                let again = error.is_conflict();
                                (error, again)
                            }
                        },
                        Err(error) => {
                            let again = error.is_conflict() || error.is_transient();
                            (error, again)
                        }
                    }
                }
                Err(error) => {
                    let again = error.is_conflict() || error.is_transient();
                    (error, again)
                }
            };
            if !again || conflicts >= MAX_CONFLICTS {
                fail(&error);
            }
            conflicts += 1;
            tokio::time::sleep(conflict_pause(conflicts)).await;
        }
    }
}

/// Runs `body`, the body of transactional step `name` (`of` names its run
/// when a warning needs it), which began at `began`, warning once it still
/// runs after holding SQLite's write lock [`STUCK_LOCK`] (`sqlite`) or its
/// PostgreSQL transaction open [`STUCK_TRANSACTION`], and again each time
/// that doubles.
async fn warn_while_stuck<R>(
    mut body: Pin<Box<dyn Future<Output = R> + Send + '_>>,
    began: std::time::Instant,
    sqlite: bool,
    name: &'static str,
    of: &(dyn Fn() -> String + Sync),
) -> R {
    let mut next = if sqlite {
        STUCK_LOCK
    } else {
        STUCK_TRANSACTION
    };
    loop {
        // (A paused clock could run the doublings past what an `Instant`
        // holds: then nothing more is said.)
        let Some(at) = began.checked_add(next) else {
            return body.await;
        };
        tokio::select! {
            biased;
            value = &mut body => return value,
            () = tokio::time::sleep_until(at.into()) => {
                let held = began.elapsed();
                let held_ms = held.as_millis() as u64;
                let of = of();
                let bound = "Bound the body's slow calls (`timeout_ms` on the step drops an \
                             attempt out of time and rolls it back), or do them in a plain step \
                             before or after it";
                if sqlite {
                    tracing::warn!(
                        step = name,
                        held_ms,
                        "keiro transactional step `{name}`{of} has held SQLite's only write lock \
                         for {held:?} and its body still runs: every other write to the database \
                         waits until it returns (other workflows' steps, lease renewals, \
                         timers). {bound}"
                    );
                } else {
                    tracing::warn!(
                        step = name,
                        held_ms,
                        "keiro transactional step `{name}`{of} has kept its PostgreSQL \
                         transaction open for {held:?} and its body still runs: until it \
                         returns its connection is out of the pool, and any rows it wrote or \
                         locked stay locked against other writers (a transaction waiting on \
                         another's lock is named here too). {bound}"
                    );
                }
                next = next.saturating_mul(2);
            }
        }
    }
}

/// Writes step `seq`'s `value` (and the decision of the select it won, if
/// any) into `tx` and commits: the application's writes and the result
/// together. Returns the step's result (another executor's when it
/// journaled the step first), or the error that stopped the commit (the
/// caller retries a conflict).
async fn commit<R>(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    name: &'static str,
    value: R,
    mut tx: Transaction<'static>,
    timing: StepTiming,
    won: &mut Option<Won>,
) -> Result<R, StoreError>
where
    R: Serialize + DeserializeOwned,
{
    let kind = StepKind::Step;
    // Dropping `tx` on the way out rolls the application's writes back.
    let result = match encode_result(cx, seq, kind, name, &value) {
        Ok(json) => json,
        Err(error) => return Ok(halt(cx, error).await),
    };
    let row = step_row(cx, seq, kind, name, result);
    let Some(decided) = won.as_ref() else {
        // The common case, one row: written and committed together (in one
        // round trip on PostgreSQL).
        let now = cx.keiro.now_us();
        let store = cx.keiro.raw_store();
        if !tx
            .into_inner()
            .journal_and_commit(store, row, timing, now)
            .await?
        {
            // Another executor journaled this step first: its result
            // stands, and these writes never happened. Its row is read, never
            // written over with this attempt's rolled-back value.
            return Ok(match store.get_step(&cx.id, cx.generation, seq).await {
                Ok(Some(first)) => replay(cx, seq, kind, name, &first).await,
                Ok(None) => {
                    let error = Error::Internal(format!(
                        "transactional step `{name}` (#{seq}) of workflow `{}` id `{}` met the \
                         journal's primary key, but no row of it is journaled",
                        cx.name, cx.id
                    ));
                    halt(cx, error).await
                }
                Err(error) => halt(cx, Error::Store(error)).await,
            });
        }
        crate::telemetry::step(name, false);
        return Ok(value);
    };
    let index = decided.index.to_string();
    let decision = step_row(cx, decided.seq, StepKind::Select, "select", index);
    let rows = [(row, timing), (decision, StepTiming::default())];
    tx.inner().check_open().await?;
    let written = tx.inner().journal(&rows, cx.keiro.now_us()).await?;
    if !written[0] {
        // Another executor journaled this step first: its result (and its
        // select decision) stands, and these writes never happened.
        tx.into_inner().rollback().await?;
        return Ok(record_step(cx, seq, kind, name, value, timing, won.take()).await);
    }
    let mut winner = decided.index;
    if written.get(1) != Some(&true) {
        // Another executor decided this select first (it took the instance
        // over while this body ran): its winner stands, read before this
        // transaction ends. A winner other than this branch means this
        // step lost there and never ran to a result: its writes roll back.
        let recorded = cx
            .keiro
            .raw_store()
            .get_step(&cx.id, cx.generation, decided.seq)
            .await;
        winner = match recorded {
            Ok(Some(first)) => replay(cx, decided.seq, StepKind::Select, "select", &first).await,
            Ok(None) => decided.index,
            Err(error) => return Ok(halt(cx, Error::Store(error)).await),
        };
    }
    if winner != decided.index {
        tx.into_inner().rollback().await?;
    } else {
        tx.into_inner().commit().await?;
        crate::telemetry::step(name, false);
    }
    if let Some(won) = won.take() {
        won.journaled(winner);
    }
    Ok(value)
}

/// Rolls back `tx`, the open transaction of an attempt whose result is not
/// to commit (another branch of its select won, or the run's deadline
/// passed). A body that ended keiro's transaction itself is caught here too
/// (see `attempt`): the error that halts the run.
async fn roll_back(
    cx: &WorkflowContext,
    seq: i64,
    name: &'static str,
    mut tx: Transaction<'static>,
) -> Result<(), Error> {
    if let Some(error) = ended_under_body(&mut tx).await {
        return Err(step_error(cx, seq, name, error));
    }
    if let Err(error) = tx.into_inner().rollback().await {
        tracing::debug!(step = name, %error, "keiro transactional step rollback failed");
    }
    Ok(())
}

/// Why `tx` can be neither committed nor rolled back as the step's: its
/// body committed or rolled back keiro's transaction itself (what it ran
/// after that committed on its own), unless SQLite rolled it back by itself
/// at the body's last statement. `None` otherwise (a transaction a failed
/// statement aborted is still open: the caller rolls it back).
async fn ended_under_body(tx: &mut Transaction<'static>) -> Option<StoreError> {
    match tx.inner().check_open().await {
        Err(error @ StoreError::TransactionEnded { .. }) => Some(error),
        Err(error @ StoreError::TransactionRolledBack { .. }) if !tx.sqlite_rolled_back() => {
            Some(error)
        }
        _ => None,
    }
}

/// `error`, naming the body's statement that `failed` first (as its
/// [`crate::TxConnection`] saw it) when the transaction was aborted.
fn naming_failed(error: StoreError, failed: Option<String>) -> StoreError {
    match (error, failed) {
        (StoreError::TransactionAborted { reason }, Some(failed)) => {
            StoreError::TransactionAborted {
                reason: format!("the statement that failed: {failed}; then: {reason}"),
            }
        }
        (error, _) => error,
    }
}

/// The error that stops step `seq`'s run: a body that ended keiro's
/// transaction itself is [`Error::TransactionEnded`], and one that
/// returned `Ok` in a transaction a failed statement aborted is
/// [`Error::TransactionAborted`], each naming the step.
fn step_error(cx: &WorkflowContext, seq: i64, name: &str, error: StoreError) -> Error {
    let what = || {
        format!(
            "transactional step `{name}` (#{seq}) of workflow `{}` id `{}`",
            cx.name, cx.id
        )
    };
    match error {
        StoreError::TransactionEnded { .. } | StoreError::TransactionRolledBack { .. } => {
            Error::TransactionEnded {
                what: what(),
                reason: error.to_string(),
            }
        }
        StoreError::TransactionAborted { .. } => Error::TransactionAborted {
            what: what(),
            reason: error.to_string(),
        },
        error => Error::Store(error),
    }
}

/// The pause before retrying after the `n`th conflict in a row: short and
/// growing, jittered so that racing steps do not retry in lockstep.
fn conflict_pause(n: u32) -> Duration {
    let ceiling = 1u64 << n.min(7); // up to 128 ms
    let jitter = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0),
    );
    Duration::from_millis(1 + jitter % ceiling)
}
