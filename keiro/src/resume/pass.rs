//! One pass of the resume worker: claim due instances, report the ones it
//! cannot run, and drive the claimed ones through the registry.

use std::collections::{BTreeMap, VecDeque};

use futures::future::Either;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use keiro_store::{BlockReason, HandOver, InstanceRow, InstanceStatus, Lease, Registered};

use super::{ResumeEvent, ResumeOptions, ResumeSummary};
use crate::runtime::inflight::Slot;
use crate::shutdown::Stop;
use crate::time::duration_us;
use crate::workflow::drive::execute;
use crate::workflow::end::HandingOver;
use crate::{Error, Keiro, Queue, Result};

use super::slots::{Held, Slots};

/// What ended in a pass's set of running instances and refill claims.
enum Finished {
    /// An instance's run, the queue it was claimed from (`None`: the
    /// default queue), and the successor its end handed its slot over to.
    Ran(
        Option<&'static Queue>,
        ResumeSummary,
        Option<Box<InstanceRow>>,
    ),
    /// A refill claim of a queue for this much room.
    Claimed(&'static Queue, i64, keiro_store::Result<Vec<InstanceRow>>),
}

/// What a pass claims queued instances under: its lease, and the workflows
/// and versions it may run.
#[derive(Clone, Copy)]
struct QueueClaim<'a> {
    lease: Lease<'a>,
    workflows: &'a [keiro_store::Registered<'a>],
    versions: &'a [&'a str],
}

impl QueueClaim<'_> {
    /// Claims up to `room` due instances of `queue` within its limits.
    async fn claim(
        self,
        keiro: &Keiro,
        queue: &'static Queue,
        room: i64,
    ) -> keiro_store::Result<Vec<InstanceRow>> {
        // While this process's clock is off the server's it claims nothing,
        // in a running pass either.
        if keiro.clock_is_off() {
            return Ok(Vec::new());
        }
        keiro
            .raw_store()
            .claim_queue(
                self.lease,
                self.workflows,
                self.versions,
                &queue.limits(),
                room,
            )
            .await
    }
}

/// A queue with a refill claim in flight.
struct Refilling {
    queue: &'static str,
    /// One of its instances ended while the claim was in flight: claim
    /// again when it returns.
    ended_meanwhile: bool,
}

/// How many unclaimable due instances (unknown names, other versions, live
/// foreign leases) a pass reports.
const BLOCKED_REPORTED: i64 = 100;

/// How many queued instances past their deadline a sweep reads at a time
/// (see [`Keiro::time_out_queued`]).
const PAST_DEADLINE_ENDED: i64 = 64;

/// How long a sweep of queued instances past their deadline goes on reading
/// more before it leaves the rest to the next one.
const PAST_DEADLINE_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

/// The workflows and versions a pass claims (see [`Keiro::claim_lists`]).
struct ClaimLists<'k> {
    workflows: Vec<Registered<'k>>,
    versions: Vec<&'k str>,
}

impl ClaimLists<'_> {
    /// What `keiro`'s pass claims under: its lease, and these lists.
    fn scope<'a>(&'a self, keiro: &'a Keiro) -> QueueClaim<'a> {
        QueueClaim {
            lease: Lease {
                owner: keiro.owner(),
                ttl_us: duration_us(keiro.lease_ttl()),
            },
            workflows: &self.workflows,
            versions: &self.versions,
        }
    }
}

/// What one pass claimed, with its summary so far (what it discovered, and
/// the due instances it cannot run).
pub(super) struct Claimed {
    rows: Vec<(Option<&'static Queue>, InstanceRow)>,
    summary: ResumeSummary,
    /// Whether a named queue was claimed for less than the pass's room (or
    /// not at all), the pass's runnable slots being taken: it may have more
    /// due, to claim as soon as slots free up.
    held_back: bool,
}

impl Claimed {
    /// How many instances the pass claimed.
    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }
}

/// Keeps the first error of a pass's claims in `failed` (reported with the
/// pass, or as its failure when it claimed nothing); reports a later one at
/// once.
fn claim_failed(options: &ResumeOptions, failed: &mut Option<Error>, error: Error) {
    match failed {
        None => *failed = Some(error),
        Some(_) => (options.log)(&ResumeEvent::PassFailed { error }),
    }
}

impl Keiro {
    /// One pass of the resume worker: discover due instances, claim and
    /// advance each, and report what happened. The single testable unit
    /// behind [`Keiro::resume_worker`].
    pub async fn resume_once(&self, options: &ResumeOptions) -> Result<ResumeSummary> {
        options.validate()?;
        // As a claim would: a runtime shut down, or whose clock is off the
        // server's (read first at the identity's taking), ends nothing.
        self.ensure_executor().await?;
        self.refuse_claims_if_clock_off()?;
        if let Err(error) = self.time_out_queued().await {
            (options.log)(&ResumeEvent::PassFailed { error });
        }
        let runnable = options.concurrency as i64;
        let claimed = self
            .claim_pass(options, true, options.claim_limit(), runnable)
            .await?;
        // Its runs are all it advances: a budget of its own.
        let held = Slots::new(options.concurrency).take(options.concurrency);
        let stop = Stop::of(self);
        Ok(self.drive_pass(claimed, options, &stop, held, false).await)
    }

    /// Starts one pass of the worker in the slots it `held` (taken from
    /// the worker's budget): claims up to twice as many instances (as a
    /// pass of `resume_once` claims up to twice the concurrency; those
    /// beyond the slots start as its first runs end), gives back the slots
    /// it has nothing for, and drives the rest in a task of `passes`.
    /// Returns whether it got all it asked for, or held a named queue back
    /// for want of slots: then more may be due.
    pub(super) async fn start_pass(
        &self,
        options: &ResumeOptions,
        stop: &Stop,
        report_blocked: bool,
        mut held: Held,
        passes: &mut tokio::task::JoinSet<()>,
    ) -> Result<bool> {
        let ask = (held.count() * 2).min(options.claim_limit() as usize);
        let runnable = held.count() as i64;
        let claimed = self
            .claim_pass(options, report_blocked, ask as i64, runnable)
            .await?;
        let got = claimed.len();
        let held_back = claimed.held_back;
        held.give_back(held.count().saturating_sub(got));
        if got == 0 {
            // Nothing to drive: report the pass at once.
            self.drive_pass(claimed, options, stop, held, true).await;
        } else {
            let (keiro, options, stop) = (self.clone(), options.clone(), stop.clone());
            passes.spawn(async move {
                keiro.drive_pass(claimed, &options, &stop, held, true).await;
            });
        }
        Ok(got >= ask || held_back)
    }

    /// The first half of a pass: claims up to `limit` due instances (of the
    /// default queue and each queue within its limits, in turns: see
    /// [`super::turns`]), and
    /// looks for the due instances it cannot run (and reports them) only
    /// when `report_blocked`. Of a named queue it claims only into the
    /// `runnable` slots the pass runs at once: a queued instance claimed
    /// beyond them would wait for a slot while its queue counts it running
    /// (holding back the queue's other instances), and its lease could lapse
    /// meanwhile and be counted free.
    pub(super) async fn claim_pass(
        &self,
        options: &ResumeOptions,
        report_blocked: bool,
        limit: i64,
        runnable: i64,
    ) -> Result<Claimed> {
        options.validate()?;
        self.ensure_executor().await?;
        self.refuse_claims_if_clock_off()?;
        self.serve_registered(options).await?;
        let store = self.raw_store();
        let owner = self.owner();
        let lists = self.claim_lists();
        let scope = lists.scope(self);
        let (workflows, versions) = (&lists.workflows, &lists.versions);
        // Claim in the same statement that discovers, so concurrent workers
        // take disjoint batches instead of racing for the same rows: the
        // default queue and each queue within its limits, in the order
        // their turns give, each for the room the ones before left.
        let queues = self.registry().queues();
        let mut rows: Vec<(Option<&'static Queue>, InstanceRow)> = Vec::new();
        let mut held_back = false;
        // A source whose claim fails (a statement timing out, the store
        // busy) does not cost the others theirs: the rows claimed before
        // it are committed and leased to this worker, and dropped they
        // would wait out their lease undriven (holding their queue's
        // slots). It is reported, counted short (so it is tried last), and
        // the pass goes on; only a pass that claimed nothing fails.
        let mut failed: Option<Error> = None;
        for source in self.claim_turns().order(queues.len() + 1) {
            let room = limit - rows.len() as i64;
            if room <= 0 {
                break;
            }
            let before = rows.len();
            match source.checked_sub(1).map(|at| queues[at]) {
                None => match store
                    .claim_due(scope.lease, workflows, versions, room)
                    .await
                {
                    Ok(claimed) => rows.extend(claimed.into_iter().map(|row| (None, row))),
                    Err(error) => claim_failed(options, &mut failed, error.into()),
                },
                Some(queue) => {
                    // Only into the slots left to start in: with none left
                    // (every slot is taken, so the worker waits for one to
                    // free up) the queue may have more due, and so it may
                    // when it filled a room cut short.
                    let runnable_room = runnable - rows.len() as i64;
                    if runnable_room <= 0 {
                        held_back = true;
                        continue;
                    }
                    let cut = runnable_room < room;
                    let room = room.min(runnable_room);
                    match scope.claim(self, queue, room).await {
                        Ok(claimed) => {
                            held_back |= cut && claimed.len() as i64 == room;
                            rows.extend(claimed.into_iter().map(|row| (Some(queue), row)));
                        }
                        Err(error) => claim_failed(options, &mut failed, error.into()),
                    }
                }
            }
            self.claim_turns()
                .claimed(source, room, rows.len() - before);
        }
        if let Some(error) = failed {
            if rows.is_empty() {
                return Err(error);
            }
            (options.log)(&ResumeEvent::PassFailed { error });
        }
        // Best effort: the report waits for the next pass that reads it.
        let blocked = match report_blocked {
            true => match store
                .find_blocked(owner, workflows, versions, BLOCKED_REPORTED)
                .await
            {
                Ok(blocked) => blocked,
                Err(error) => {
                    (options.log)(&ResumeEvent::PassFailed {
                        error: error.into(),
                    });
                    Vec::new()
                }
            },
            false => Vec::new(),
        };
        let mut summary = ResumeSummary {
            discovered: rows.len() + blocked.len(),
            ..ResumeSummary::default()
        };
        // Instances of other versions are reported once per version.
        let mut other_versions: BTreeMap<String, usize> = BTreeMap::new();
        for row in blocked {
            let (name, id) = (row.name, row.id);
            match row.reason {
                BlockReason::UnknownName => {
                    summary.unknown_name += 1;
                    (options.log)(&ResumeEvent::UnknownName { name, id });
                }
                BlockReason::SignatureMismatch { stored, registered } => {
                    summary.unknown_name += 1;
                    (options.log)(&ResumeEvent::SignatureMismatch {
                        name,
                        id,
                        stored,
                        registered,
                    });
                }
                BlockReason::OtherVersion { version } => {
                    summary.other_version += 1;
                    *other_versions.entry(version).or_default() += 1;
                }
                _ => summary.lease_skipped += 1,
            }
        }
        for (version, due) in other_versions {
            (options.log)(&ResumeEvent::OtherVersion {
                version,
                due,
                own: self.app_version().to_owned(),
            });
        }
        Ok(Claimed {
            rows,
            summary,
            held_back,
        })
    }

    /// Ends the queued instances whose deadline passed while no run held
    /// them (waiting for a slot, suspended, or left by a worker that died)
    /// as timed out, [`PAST_DEADLINE_ENDED`] at a time until none is left
    /// or [`PAST_DEADLINE_BUDGET`] is spent: a queue's claims and
    /// hand-overs leave them, so none takes a slot or a start only to be
    /// ended, and their callers learn at the deadline, not once a slot
    /// frees up. The first failure stops the sweep; the next one tries
    /// again.
    pub(super) async fn time_out_queued(&self) -> Result<()> {
        // A clock off the server's would end them early (or, behind, late):
        // left to workers whose clocks agree, as claims are.
        if self.clock_is_off() {
            return Ok(());
        }
        let store = self.raw_store();
        let started = tokio::time::Instant::now();
        loop {
            let ids = store.queued_past_deadline(PAST_DEADLINE_ENDED).await?;
            let all = (ids.len() as i64) < PAST_DEADLINE_ENDED;
            for id in ids {
                // On error, left for the next sweep (which reads it again).
                self.time_out(&id).await?;
            }
            if all || started.elapsed() >= PAST_DEADLINE_BUDGET {
                return Ok(());
            }
        }
    }

    /// The second half of a pass: drives what it `claimed` in the slots it
    /// `held` (as many as it may run at once; it gives each back as it is
    /// done with it), then reports the pass. A worker's pass (`renews`)
    /// keeps its queues' slots filled for as long as the worker wants none
    /// back, reporting each time it has run as many as a pass claims; one
    /// of [`Keiro::resume_once`] refills no more after that many, and ends.
    pub(super) async fn drive_pass(
        &self,
        claimed: Claimed,
        options: &ResumeOptions,
        stop: &Stop,
        held: Held,
        renews: bool,
    ) -> ResumeSummary {
        let lists = self.claim_lists();
        let scope = lists.scope(self);
        let summary = self
            .run_claimed(claimed, scope, options, stop, held, renews)
            .await;
        match self.raw_store().count_pending_awakeables().await {
            Ok(n) => crate::telemetry::awakeables_pending(n),
            Err(error) => tracing::debug!(%error, "keiro could not count pending awakeables"),
        }
        report(options, summary);
        summary
    }

    /// The workflows and versions this process runs, which a pass claims.
    fn claim_lists(&self) -> ClaimLists<'_> {
        ClaimLists {
            workflows: self.registry().workflows(),
            versions: self.versions().accepted(),
        }
    }

    /// Drives a pass's claimed instances, at most as many at once as the
    /// slots it `held`. Slots it no longer needs (an instance ended,
    /// and nothing waits for its slot or is being claimed into it) go back
    /// to the worker at once, for its next pass. Each time one of a queue's
    /// instances ends, its slot is free: the pass claims that queue again at
    /// once (within its limits, for the room this pass has) instead of
    /// leaving the slot empty until the next pass, so a busy queue stays
    /// full. Those refills stop after as many more instances as a pass
    /// claims, and when the worker is stopping: the slots then go back to
    /// the worker, whose next pass (woken at once) claims from the default
    /// queue and every queue alike, so no queue keeps its slots forever.
    ///
    /// A queued instance whose run returns hands its slot over to the next
    /// of its partition in the commit that records its end (see
    /// [`HandOver`]): no claim, no wait for the queue's lock, and no moment
    /// with the slot empty. It is refilled by a claim as above when its
    /// partition has no successor, when it ended otherwise (suspended,
    /// crashed), and on a queue with a rate limit.
    ///
    /// A refill claim is polled in the same set as the running instances:
    /// awaiting it alone would stop polling them while they hold pool
    /// connections, and the claim could wait for a connection forever.
    async fn run_claimed(
        &self,
        claimed: Claimed,
        scope: QueueClaim<'_>,
        options: &ResumeOptions,
        stop: &Stop,
        mut held: Held,
        renews: bool,
    ) -> ResumeSummary {
        let Claimed {
            rows, mut summary, ..
        } = claimed;
        let mut waiting: VecDeque<_> = rows.into();
        let mut active = FuturesUnordered::new();
        let run = |queue: Option<&'static Queue>, row: InstanceRow, hand_over: Option<HandOver>| {
            Either::Left(async move {
                let mut handing = hand_over.map(|h| HandingOver::new(h, stop.clone()));
                let one = self
                    .advance_handing(
                        row,
                        options,
                        stop.clone(),
                        handing.as_mut(),
                        queue.is_some(),
                    )
                    .await;
                Finished::Ran(queue, one, handing.and_then(|h| h.successor).map(Box::new))
            })
        };
        // What a run of `row` from `queue` hands its slot over with, if it
        // may: the pass still refills, the queue has no rate limit, and this
        // process's clock is not off (a hand-over claims by it).
        let hand_over = |queue: Option<&'static Queue>, row: &InstanceRow, refills_left: i64| {
            let queue = queue.filter(|q| q.limits().rate_limit.is_none())?;
            if refills_left <= 0 || stop.is_draining() || self.clock_is_off() {
                return None;
            }
            let signature = self.registry().signature(&row.name)?;
            let workflow = Registered {
                name: &row.name,
                signature,
            };
            Some(HandOver::new(
                &queue.limits(),
                workflow,
                scope.lease.ttl_us,
                scope.versions,
            ))
        };
        let claim = |queue: &'static Queue, room: i64| {
            Either::Right(async move {
                Finished::Claimed(queue, room, scope.claim(self, queue, room).await)
            })
        };
        let mut refills_left = options.claim_limit();
        // A refill claim failed: the pass refills no more, renewed or not
        // (the worker's next pass claims again).
        let mut refill_failed = false;
        // Instances running, and slots promised to claims in flight.
        let (mut running, mut promised) = (0usize, 0usize);
        // At most one refill claim in flight per queue.
        let mut refilling: Vec<Refilling> = Vec::new();
        loop {
            let renew = renews && !refill_failed && !held.wanted() && !stop.is_draining();
            if renew && refills_left <= 0 {
                // As many as a pass claims ran on: report them as a pass,
                // and go on.
                report(options, std::mem::take(&mut summary));
                refills_left = options.claim_limit();
            }
            while running < held.count() {
                let Some((queue, row)) = waiting.pop_front() else {
                    break;
                };
                running += 1;
                let hand_over = hand_over(queue, &row, refills_left);
                active.push(run(queue, row, hand_over));
            }
            if refilling.is_empty() {
                // No claim will fill the slots nothing waits for.
                let spare = held.count().saturating_sub(running + waiting.len());
                held.give_back(spare);
            }
            let Some(finished) = active.next().await else {
                break;
            };
            let queue = match finished {
                Finished::Ran(queue, one, successor) => {
                    running -= 1;
                    summary = summary.add(one);
                    let Some(queue) = queue else { continue };
                    if let Some(next) = successor {
                        // Its slot is the successor's already: run it next.
                        refills_left -= 1;
                        summary.discovered += 1;
                        waiting.push_front((Some(queue), *next));
                        continue;
                    }
                    if let Some(claim) = refilling.iter_mut().find(|c| c.queue == queue.name()) {
                        claim.ended_meanwhile = true;
                        continue;
                    }
                    queue
                }
                Finished::Claimed(queue, room, rows) => {
                    promised -= room as usize;
                    let at = refilling.iter().position(|c| c.queue == queue.name());
                    let again = at.is_some_and(|at| refilling.swap_remove(at).ended_meanwhile);
                    match rows {
                        Ok(rows) => {
                            // Room not taken returns to the budget.
                            refills_left += room - rows.len() as i64;
                            summary.discovered += rows.len();
                            waiting.extend(rows.into_iter().map(|row| (Some(queue), row)));
                        }
                        Err(error) => {
                            // The runs in flight go on; the next pass claims
                            // again.
                            refills_left = 0;
                            refill_failed = true;
                            tracing::warn!(%error, queue = queue.name(), "keiro could not refill a queue");
                        }
                    }
                    if !again {
                        continue;
                    }
                    queue
                }
            };
            // One of `queue`'s instances ended since its last claim: claim
            // it again, one claim in flight per queue (the instances ending
            // while it waits for the queue's lock are refilled together by
            // the next, not each by a claim of its own).
            if stop.is_draining() {
                continue;
            }
            if refills_left <= 0 {
                // This pass refills no more: the worker's next pass claims
                // into the slot, at once.
                self.wake_resume_worker();
                continue;
            }
            let used = running + waiting.len() + promised;
            let room = (held.count().saturating_sub(used) as i64).min(refills_left);
            if room <= 0 {
                continue;
            }
            promised += room as usize;
            refills_left -= room;
            refilling.push(Refilling {
                queue: queue.name(),
                ended_meanwhile: false,
            });
            active.push(claim(queue, room));
        }
        summary
    }

    /// Records (once per runtime) which workflow names this worker serves and
    /// which queues it claims from, so a caller waiting on an instance no
    /// live worker serves is told, and
    /// logs them: a workflow missing from this list was never linked into
    /// the binary (see [`crate::link!`]).
    async fn serve_registered(&self, options: &ResumeOptions) -> Result<()> {
        self.serving()
            .get_or_try_init(|| async {
                let names = self.registry().names();
                let declared = self.registry().queues();
                let limits: Vec<String> = declared.iter().map(|q| q.describe_limits()).collect();
                // The default queue first, as `""`: it says this worker
                // registers its queues (see `Store::queue_unserved`).
                let registered: Vec<(&str, &str)> = std::iter::once(("", "default queue"))
                    .chain(
                        declared
                            .iter()
                            .zip(&limits)
                            .map(|(queue, limits)| (queue.name(), limits.as_str())),
                    )
                    .collect();
                let store = self.raw_store();
                store
                    .register_workflows(self.owner(), &names, &registered)
                    .await?;
                // Liveness is real time whatever the runtime's clock.
                let alive_since =
                    keiro_store::now_us() - duration_us(crate::runtime::identity::EXECUTOR_TTL);
                for other in store
                    .queue_limits_elsewhere(self.owner(), alive_since)
                    .await?
                {
                    let ours = registered
                        .iter()
                        .find(|(name, _)| *name == other.queue)
                        .map_or_else(String::new, |(_, limits)| (*limits).to_owned());
                    (options.log)(&ResumeEvent::QueueLimitsDiffer {
                        queue: other.queue,
                        executor: other.executor_id,
                        theirs: other.limits,
                        ours,
                    });
                }
                if names.is_empty() {
                    tracing::warn!(
                        executor = %self.owner(),
                        "keiro resume worker serves no workflow: none is linked into this binary \
                         (a crate of workflows that main never names is dropped by the linker; \
                         add `keiro::link!(that_crate);`)"
                    );
                } else {
                    // Its named queues: what it registered after the default.
                    let named = &registered[1..];
                    let queues: Vec<&str> = named.iter().map(|(name, _)| *name).collect();
                    tracing::info!(
                        executor = %self.owner(),
                        workflows = %names.join(", "),
                        queues = %queues.join(", "),
                        "keiro resume worker serves {} workflow(s) and claims from {} named \
                         queue(s)",
                        names.len(),
                        named.len()
                    );
                }
                Ok::<_, Error>(())
            })
            .await
            .map(|_| ())
    }

    /// Drives one instance this worker claimed (a pass's, or a cron tick's
    /// its scheduler created under this process's lease), reading its
    /// journal unless `row.fresh` says it has none.
    pub(crate) async fn advance(
        &self,
        row: InstanceRow,
        options: &ResumeOptions,
        stop: Stop,
    ) -> ResumeSummary {
        self.advance_handing(row, options, stop, None, false).await
    }

    /// [`Keiro::advance`], handing the instance's queue slot over as
    /// `handing` says when its run returns. Of an instance of a named queue
    /// (`queued`), a run that stops without an end of its own recorded
    /// frees the slot a cancel or time-out kept for it (see
    /// `Store::release_ended`).
    async fn advance_handing(
        &self,
        row: InstanceRow,
        options: &ResumeOptions,
        stop: Stop,
        handing: Option<&mut HandingOver>,
        queued: bool,
    ) -> ResumeSummary {
        let mut summary = ResumeSummary::default();
        if stop.is_halting() {
            // Claimed but not started when a shutdown halted the worker: hand
            // it back unstarted. (While draining, what a pass claimed runs.)
            let _ = self.raw_store().release(&row.id, self.owner()).await;
            return summary;
        }
        let Some(registration) = self.registry().get(&row.name) else {
            // Claimed by name, so registered; keep the guard all the same.
            summary.unknown_name = 1;
            let _ = self.raw_store().release(&row.id, self.owner()).await;
            return summary;
        };
        let driving = match self.inflight().take(&row.id, registration.name) {
            Slot::Mine(driving) => driving,
            // This process runs it already (under the same lease owner).
            Slot::Attached(_) | Slot::Conflict(_) => {
                summary.lease_skipped = 1;
                return summary;
            }
        };
        let (name, id) = (row.name.clone(), row.id.clone());
        let row = match self.still_held(row).await {
            Ok(Some(row)) => row,
            Ok(None) => {
                // Its lease lapsed while it waited for a slot, and another
                // run took it (running this copy would repeat its steps), or
                // it was cancelled meanwhile.
                self.inflight().release(driving);
                if queued {
                    self.let_go_of_ended(&id).await;
                }
                summary.lease_skipped = 1;
                return summary;
            }
            Err(error) => {
                // Left to its lease: the next pass that can claims it.
                self.inflight().release(driving);
                summary.transient_errors = 1;
                (options.log)(&ResumeEvent::TransientError { name, id, error });
                return summary;
            }
        };
        summary.resumed = 1;
        let result = execute(self, registration.run, row, stop, handing, None).await;
        // Cancelled, timed out, lost or refused: its end is not its own.
        let own_end = matches!(&result, Ok(Some(done))
            if !matches!(done.status, InstanceStatus::Cancelled | InstanceStatus::TimedOut));
        match &result {
            Ok(Some(done)) => match done.status {
                InstanceStatus::Failed if done.output.is_none() => {
                    summary.failed = 1;
                    (options.log)(&ResumeEvent::MarkedFailed {
                        name: done.name.clone(),
                        id: done.id.clone(),
                        message: done.error.clone().unwrap_or_default(),
                    });
                }
                InstanceStatus::Suspended => summary.still_suspended = 1,
                InstanceStatus::TimedOut => summary.timed_out = 1,
                InstanceStatus::Cancelled => summary.cancelled = 1,
                _ => summary.completed = 1,
            },
            Ok(None) => summary.lease_skipped = 1,
            Err(Error::NonDeterministic { .. }) => summary.failed = 1,
            // Released by a clean shutdown; nothing to report.
            Err(Error::Stopped { .. }) => {}
            Err(error) if error.is_transient() => {
                summary.transient_errors = 1;
                (options.log)(&ResumeEvent::TransientError {
                    name: name.clone(),
                    id: id.clone(),
                    error: error.clone(),
                });
            }
            Err(error) => (options.log)(&ResumeEvent::Crashed {
                name: name.clone(),
                id: id.clone(),
                error: error.clone(),
            }),
        }
        match result {
            Ok(Some(done)) => self.inflight().publish(driving, Ok(done)),
            _ => self.inflight().release(driving),
        }
        // Once this process drives it no more: a retry may have put it back
        // in line, due as the hold goes, and a pass of this process that
        // claims it then must find it free to drive.
        if queued && !own_end {
            self.let_go_of_ended(&id).await;
        }
        summary
    }

    /// Frees the slot of instance `id` of a named queue if it was
    /// cancelled or timed out while its run (one of this executor's, which
    /// has stopped) held it:
    /// the queue counted it as running until now (see
    /// `Store::release_ended`). Then wakes the workers to fill the slot.
    /// Failing that, the hold passes with the lease's expiry: logged, not
    /// returned.
    async fn let_go_of_ended(&self, id: &str) {
        match self.raw_store().release_ended(id, self.owner()).await {
            Ok(false) => {}
            Ok(true) => self.wake_all_workers("a freed queue slot").await,
            Err(error) => {
                tracing::debug!(%error, id, "keiro could not free an ended run's queue slot; it frees when its lease would have lapsed");
            }
        }
    }

    /// `row`, claimed by this worker, if it still holds it. A row claimed
    /// more than a lease renewal interval ago (it waited for a slot behind
    /// longer runs) may have lapsed and been taken by another run: its lease
    /// is renewed first, and the row read again. `None` when the lease
    /// lapsed (by this process's clock), went elsewhere, or the instance
    /// moved on.
    async fn still_held(&self, row: InstanceRow) -> Result<Option<InstanceRow>> {
        let ttl_us = duration_us(self.lease_ttl());
        let Some(expires) = row.lease_expires_at else {
            return Ok(Some(row));
        };
        let now = self.now_us();
        if now < expires.saturating_sub(ttl_us) + ttl_us / 3 {
            return Ok(Some(row));
        }
        if now >= expires {
            // Lapsed: a claim may have counted it free (and, of a queue,
            // started another in its slot), so it is not taken back; it is
            // due for any claim, this worker's next included.
            return Ok(None);
        }
        let lease = Lease {
            owner: self.owner(),
            ttl_us,
        };
        if !self.raw_store().renew_lease(&row.id, lease).await? {
            return Ok(None);
        }
        let again = self.raw_store().get_instance(&row.id).await?;
        Ok(again.filter(|now| now.generation == row.generation && !now.status.is_final()))
    }
}

/// Reports a pass's `summary`: to the metrics, and as
/// [`ResumeEvent::Pass`].
fn report(options: &ResumeOptions, summary: ResumeSummary) {
    crate::telemetry::pass(&summary);
    (options.log)(&ResumeEvent::Pass(summary));
}
