//! The journal: workflow instances, their leases and their recorded steps.
//!
//! Every operation is written once; `sqlite/journal.rs` and
//! `postgres/journal.rs` hold the two steps that differ: the insert-or-read
//! of one instance and the append of a batch of steps.

use crate::query::Arg;
#[cfg(feature = "postgres")]
use crate::query::Session;
use crate::rows::FromRow;
use crate::validate::validate_id;
use crate::{
    rows, AppendOutcome, Cancellation, Conn, ContinueAsNew, Finish, HandOver, InstanceRow,
    InstanceStatus, Lease, NewInstance, Resolution, Result, StepRow, Store, StoreError, Suspend,
};

/// How a step's body ran before its result was recorded, journaled beside
/// it (both `None` for entries that run no body: sleeps, answers, children).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTiming {
    /// How many times the body ran, retries included.
    pub attempts: Option<u32>,
    /// When its first attempt began (µs since the Unix epoch).
    pub started_at: Option<i64>,
}

impl StepTiming {
    /// The timing of row `i` of a batch whose timings are `timings` (empty:
    /// none known).
    pub(crate) fn of(timings: &[StepTiming], i: usize) -> StepTiming {
        timings.get(i).copied().unwrap_or_default()
    }

    /// The attempts as the column holds them.
    pub(crate) fn attempts_column(self) -> Option<i64> {
        self.attempts.map(i64::from)
    }
}

impl Store {
    /// Records a new instance, or returns the existing one with that id.
    /// The `bool` is `true` when this call created the row.
    pub async fn create_instance(&self, new: &NewInstance<'_>) -> Result<(InstanceRow, bool)> {
        Ok(self
            .create_instances(std::slice::from_ref(new))
            .await?
            .remove(0))
    }

    /// Like [`Store::create_instance`] for several instances, in one transaction.
    ///
    /// An empty id or name, one holding a NUL byte or one longer than
    /// [`crate::MAX_ID_BYTES`] is refused with [`StoreError::InvalidId`]
    /// before anything is written.
    pub async fn create_instances(
        &self,
        news: &[NewInstance<'_>],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        const OP: &str = "create_instance";
        for new in news {
            validate_id("workflow id", new.id)?;
            validate_id("workflow name", new.name)?;
        }
        let now = self.now_us();
        match (self, news) {
            (_, []) => Ok(Vec::new()),
            // One statement, committing alone (two for a batch that meets
            // ids taken already).
            #[cfg(feature = "postgres")]
            (Store::Postgres(pg), [one]) => {
                let mut conn = pg.acquire(OP).await?;
                let created = pg.create_on(&mut conn, one, now).await?;
                conn.done(OP).await?;
                Ok(vec![created])
            }
            #[cfg(feature = "postgres")]
            (Store::Postgres(pg), _) => pg.create_many(news, now).await,
            // One insert per 64 (and a read of ids taken already) in one
            // transaction.
            #[cfg(feature = "sqlite")]
            (Store::Sqlite(s), _) => {
                let mut tx = s.begin(OP).await?;
                let created = crate::sqlite::journal::create_many_on(&mut tx, news, now).await?;
                tx.commit().await.map_err(StoreError::query(OP))?;
                Ok(created)
            }
        }
    }

    /// Reads one instance.
    pub async fn get_instance(&self, id: &str) -> Result<Option<InstanceRow>> {
        self.fetch_optional("get_instance", |sql| &sql.get_instance, &args![id])
            .await
    }

    /// Claims an unfinished instance for `lease.owner` when nobody holds a live
    /// lease on it (or the owner already does), marking it running. Returns the
    /// claimed row, or `None` when it is finished, missing or leased
    /// elsewhere, on a named queue (its queue's claim starts it, within the
    /// limits), or pending with a start time still ahead (a delay, a
    /// debounce, a back-off).
    pub async fn claim(&self, id: &str, lease: Lease<'_>) -> Result<Option<InstanceRow>> {
        let now = self.now_us();
        let args = args![id, lease.owner, now + lease.ttl_us, now];
        self.fetch_optional("claim", |sql| &sql.claim, &args).await
    }

    /// Extends a lease `lease.owner` holds. `false` when it no longer holds
    /// it, and, for an instance of a named queue, when its lease lapsed: a
    /// claim may have counted its slot free and filled it since, so the
    /// run must not take the slot back (it stops, and the instance goes
    /// back to its queue's claims, within the limits).
    pub async fn renew_lease(&self, id: &str, lease: Lease<'_>) -> Result<bool> {
        let now = self.now_us();
        let args = args![id, lease.owner, now + lease.ttl_us, now];
        Ok(self
            .execute("renew_lease", |sql| &sql.renew_lease, &args)
            .await?
            == 1)
    }

    /// Drops `owner`'s lease on an instance, leaving its status as it is.
    pub async fn release(&self, id: &str, owner: &str) -> Result<()> {
        let args = args![id, owner, self.now_us()];
        self.execute("release", |sql| &sql.release, &args).await?;
        Ok(())
    }

    /// Frees the slot of an instance of a named queue that was cancelled or
    /// timed out while it ran: [`Store::cancel`] and [`Store::time_out`]
    /// keep its lease's expiry (not its owner), so the queue counts it as
    /// running until its run has stopped or that time passes, and so does
    /// [`Store::retry`] of it meanwhile (the retried instance is due when
    /// the hold ends: now, if this frees it). The run calls this once it has
    /// stopped, with its lease's `owner`: only the run that held the lease
    /// when the cancel came frees the hold (a stale run whose lease lapsed
    /// before another took the instance over does not). `true` when there
    /// was such a hold (its slot is free now: wake the queue's workers).
    pub async fn release_ended(&self, id: &str, owner: &str) -> Result<bool> {
        let args = args![id, self.now_us(), owner];
        Ok(self
            .execute("release_ended", |sql| &sql.release_ended, &args)
            .await?
            == 1)
    }

    /// Reads every recorded step of one generation, in sequence order.
    pub async fn load_journal(&self, id: &str, generation: i64) -> Result<Vec<StepRow>> {
        let args = args![id, generation];
        self.fetch_all("load_journal", |sql| &sql.load_journal, &args, None)
            .await
    }

    /// Records step results, all or none: in one statement (SQLite, up to
    /// 256 rows; PostgreSQL) or one transaction. A step id that is already
    /// recorded keeps its first result, which is returned as
    /// [`AppendOutcome::Existing`].
    pub async fn append_steps(&self, rows: &[StepRow]) -> Result<Vec<AppendOutcome>> {
        self.append_timed_steps(rows, &[]).await
    }

    /// [`Store::append_steps`], journaling `timings[i]` with `rows[i]`
    /// (`timings` is as long as `rows`, or empty when none are known).
    pub async fn append_timed_steps(
        &self,
        rows: &[StepRow],
        timings: &[StepTiming],
    ) -> Result<Vec<AppendOutcome>> {
        dispatch!(Store, self, |s| s.append_steps(rows, timings).await)
    }

    /// Records chains of step rows in one transaction. A chain is rows of
    /// one instance and generation, in the order its run computed them;
    /// each is recorded only if every row before it in its chain was. The
    /// outcomes of a chain (one list per chain, same position) end at its
    /// first row whose step id was recorded already
    /// ([`AppendOutcome::Existing`], with the row recorded first): the rows
    /// after it are not recorded, so the journal never holds a run's later
    /// step next to an earlier one that another run recorded (that run lost
    /// its lease, and its later steps may have used the value it computed
    /// instead).
    pub async fn append_chains(
        &self,
        chains: &[&[(StepRow, StepTiming)]],
    ) -> Result<Vec<Vec<AppendOutcome>>> {
        const OP: &str = "append_chains";
        for rows in chains {
            let Some((first, _)) = rows.first() else {
                continue;
            };
            let other_run = |(row, _): &&(StepRow, StepTiming)| {
                row.workflow_id != first.workflow_id || row.generation != first.generation
            };
            if let Some((row, _)) = rows.iter().find(other_run) {
                return Err(StoreError::Corrupt {
                    what: format!(
                        "step {} of instance `{}` (generation {}) came in one chain with step {} \
                         of instance `{}` (generation {})",
                        row.seq,
                        row.workflow_id,
                        row.generation,
                        first.seq,
                        first.workflow_id,
                        first.generation
                    ),
                });
            }
            if !distinct(rows.iter().map(|(row, _)| row.seq).collect()) {
                return Err(StoreError::Corrupt {
                    what: format!(
                        "a chain of instance `{}` (generation {}) holds one step twice",
                        first.workflow_id, first.generation
                    ),
                });
            }
        }
        // A lone row follows nothing: one statement, as a lone append.
        if let [[(row, timing)]] = chains {
            let outcomes = self
                .append_timed_steps(std::slice::from_ref(row), &[*timing])
                .await?;
            return Ok(vec![outcomes]);
        }
        // Two chains of one run each in a transaction of its own: the rows
        // one of them inserted are never taken for the other's. (An error
        // may then come after earlier chains committed; the writer puts two
        // chains of one run in separate calls, so it never meets one.)
        let runs: Vec<(&str, i64)> = chains
            .iter()
            .filter_map(|rows| rows.first())
            .map(|(row, _)| (row.workflow_id.as_str(), row.generation))
            .collect();
        if !distinct(runs) {
            let mut outcomes = Vec::with_capacity(chains.len());
            for i in 0..chains.len() {
                outcomes.extend(Box::pin(self.append_chains(&chains[i..=i])).await?);
            }
            return Ok(outcomes);
        }
        let mut batch: Vec<(&StepRow, StepTiming)> = chains
            .iter()
            .flat_map(|rows| rows.iter().map(|(row, timing)| (row, *timing)))
            .collect();
        if batch.is_empty() {
            return Ok(vec![Vec::new(); chains.len()]);
        }
        in_step_id_order(&mut batch);
        let now = self.now_us();
        // On PostgreSQL, chains that meet no journaled row are one statement;
        // when one does, that statement wrote nothing, and the transaction
        // below finds which.
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)] // PostgreSQL the only backend
        if let Store::Postgres(pg) = self {
            if pg.append_all_steps(&batch, now).await? {
                return Ok(chains
                    .iter()
                    .map(|rows| vec![AppendOutcome::Inserted; rows.len()])
                    .collect());
            }
        }
        dispatch!(Store, self, |s| {
            let mut tx = s.begin_batch(OP).await?;
            let inserted = insert_steps_in((&mut *tx).into(), OP, &batch, now).await?;
            let mut outcomes = Vec::with_capacity(chains.len());
            for rows in chains {
                let mut chain = Vec::with_capacity(rows.len());
                let mut stopped = false;
                for (row, _) in rows.iter() {
                    let ours =
                        inserted.contains(&(row.workflow_id.clone(), row.generation, row.seq));
                    match (stopped, ours) {
                        // Behind a row another run recorded: nobody saw
                        // this transaction's row yet, so it goes.
                        (true, true) => delete_step_on((&mut *tx).into(), OP, row).await?,
                        (true, false) => {}
                        (false, true) => chain.push(AppendOutcome::Inserted),
                        (false, false) => {
                            let first = journaled_on((&mut *tx).into(), OP, row).await?;
                            chain.push(AppendOutcome::Existing(first));
                            stopped = true;
                        }
                    }
                }
                outcomes.push(chain);
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(outcomes)
        })
    }

    /// Moves an unfinished instance to a final status, releasing the lease.
    /// Applies only while `finish.owner` holds the lease or nobody does;
    /// returns whether it applied.
    pub async fn finish(&self, finish: &Finish<'_>) -> Result<bool> {
        Ok(self
            .finish_many(std::slice::from_ref(finish))
            .await?
            .remove(0))
    }

    /// Like [`Store::finish`] for several instances: each applies or not on
    /// its own (see [`Store::finish_handing_over`] for how they commit).
    pub async fn finish_many(&self, finishes: &[Finish<'_>]) -> Result<Vec<bool>> {
        let none = vec![None; finishes.len()];
        let finished = self.finish_handing_over(finishes, &none).await?;
        Ok(finished.into_iter().map(|(applied, _)| applied).collect())
    }

    /// Like [`Store::finish_many`]; besides, each applied finish whose
    /// `hand_overs` entry (same position) is set hands its queue slot to its
    /// successor in the same transaction (see [`HandOver`]): the claimed
    /// successor is returned beside whether the finish applied.
    ///
    /// They commit in one transaction, except on SQLite, where several that
    /// hand nothing over first finish those without a parent in one
    /// statement committing on its own, and then the others in a
    /// transaction. An error after that statement leaves its finishes
    /// applied: a retry finds those instances ended and reports `false`
    /// for them, as after a commit whose answer was lost (callers then read
    /// the recorded end).
    pub async fn finish_handing_over(
        &self,
        finishes: &[Finish<'_>],
        hand_overs: &[Option<&HandOver>],
    ) -> Result<Vec<(bool, Option<InstanceRow>)>> {
        const OP: &str = "finish";
        let now = self.now_us();
        // A lone finish that hands nothing over is one statement committing
        // on its own, unless it is a child's (then it matches no row, and
        // the transaction below also reports it to its parent).
        if let ([finish], [None]) = (finishes, hand_overs) {
            let args = finish_args(finish, now);
            if self.execute(OP, |s| &s.finish_alone, &args).await? == 1 {
                return Ok(vec![(true, None)]);
            }
        }
        // Likewise with its hand-over, where one statement can hold both.
        if let ([finish], [Some(hand_over)]) = (finishes, hand_overs) {
            if let Some(successor) = self
                .finish_alone_handing_over(finish, hand_over, now)
                .await?
            {
                return Ok(vec![(true, successor)]);
            }
        }
        // On SQLite, several that hand nothing over: those without a parent
        // in one statement committing on its own, the rest in a transaction.
        // (Not on PostgreSQL: its batch statements run in a transaction
        // that plans them generically (see `begin_batch`); alone, the finish
        // was planned for its arrays at each execution, and the unlimited
        // `queue_throughput` fell from about 7,900 to 2,300 wf/s.)
        #[cfg(feature = "sqlite")]
        #[allow(irrefutable_let_patterns)]
        if let (Store::Sqlite(s), true) = (
            self,
            finishes.len() > 1 && hand_overs.iter().all(Option::is_none) && distinct_ids(finishes),
        ) {
            let alone = s.finish_many_alone(finishes, now).await?;
            let rest: Vec<Finish<'_>> = finishes
                .iter()
                .zip(&alone)
                .filter(|(_, applied)| !**applied)
                .map(|(finish, _)| *finish)
                .collect();
            if rest.is_empty() {
                return Ok(alone.into_iter().map(|applied| (applied, None)).collect());
            }
            let none = vec![None; rest.len()];
            let mut rest = self
                .finish_in_transaction(&rest, &none, now)
                .await?
                .into_iter();
            return alone
                .into_iter()
                .map(|applied| match applied {
                    true => Ok((true, None)),
                    false => rest.next().ok_or_else(|| StoreError::Corrupt {
                        what: "a batch of finishes returned too few outcomes".into(),
                    }),
                })
                .collect();
        }
        self.finish_in_transaction(finishes, hand_overs, now).await
    }

    /// [`Store::finish_handing_over`] in one transaction.
    async fn finish_in_transaction(
        &self,
        finishes: &[Finish<'_>],
        hand_overs: &[Option<&HandOver>],
        now: i64,
    ) -> Result<Vec<(bool, Option<InstanceRow>)>> {
        const OP: &str = "finish";
        dispatch!(Store, self, |s| {
            let mut tx = s.begin_batch(OP).await?;
            let finished =
                finish_handing_over_on((&mut *tx).into(), finishes, hand_overs, now).await?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(finished)
        })
    }

    /// Like [`Store::finish_handing_over`], with the step rows each run
    /// journaled last (`steps`, same position as its finish) inserted in the
    /// same transaction: a run's last steps and its end commit together, or
    /// not at all.
    ///
    /// A finish applies only if each of its rows was inserted, or was found
    /// journaled already with the same kind, name and result (a try before
    /// this one committed it). A row found with another result was journaled
    /// by another executor, so the run that computed this end lost its
    /// lease: the finish reports `(false, None)`. A finish that does not
    /// apply, for that reason or any other (the lease is another's, the
    /// instance ended), writes none of its rows either: rows after one that
    /// another run journaled would mix two runs in one journal. Rows must
    /// belong to the instance and generation of their finish.
    pub async fn finish_after_steps(
        &self,
        finishes: &[Finish<'_>],
        hand_overs: &[Option<&HandOver>],
        steps: &[&[(StepRow, StepTiming)]],
    ) -> Result<Vec<(bool, Option<InstanceRow>)>> {
        const OP: &str = "finish";
        if steps.iter().all(|rows| rows.is_empty()) {
            return self.finish_handing_over(finishes, hand_overs).await;
        }
        if finishes.len() != hand_overs.len() || finishes.len() != steps.len() {
            return Err(StoreError::Corrupt {
                what: format!(
                    "{} finishes came with {} hand-overs and {} step lists",
                    finishes.len(),
                    hand_overs.len(),
                    steps.len()
                ),
            });
        }
        for (finish, rows) in finishes.iter().zip(steps) {
            if let Some((row, _)) = rows.iter().find(|(row, _)| {
                row.workflow_id != finish.id || row.generation != finish.generation
            }) {
                return Err(StoreError::Corrupt {
                    what: format!(
                        "step {} of instance `{}` (generation {}) came with the end of instance \
                         `{}` (generation {})",
                        row.seq, row.workflow_id, row.generation, finish.id, finish.generation
                    ),
                });
            }
        }
        // Two ends of one instance (a run twice under one owner) each in a
        // transaction of its own: the rows one of them inserted are never
        // taken for the other's.
        if finishes.len() > 1 && !distinct_ids(finishes) {
            let mut finished = Vec::with_capacity(finishes.len());
            for i in 0..finishes.len() {
                let one = (&finishes[i..=i], &hand_overs[i..=i], &steps[i..=i]);
                finished.extend(Box::pin(self.finish_after_steps(one.0, one.1, one.2)).await?);
            }
            return Ok(finished);
        }
        let now = self.now_us();
        let mut batch: Vec<(&StepRow, StepTiming)> = steps
            .iter()
            .flat_map(|rows| rows.iter().map(|(row, timing)| (row, *timing)))
            .collect();
        in_step_id_order(&mut batch);
        // On PostgreSQL a lone end without a parent or a hand-over is one
        // statement with its rows; when it does not apply (it then wrote
        // nothing), the transaction below finds out why.
        #[cfg(feature = "postgres")]
        if let (Store::Postgres(pg), [finish], [None]) = (self, finishes, hand_overs) {
            if pg.finish_alone_after_steps(finish, &batch, now).await? {
                return Ok(vec![(true, None)]);
            }
        }
        dispatch!(Store, self, |s| {
            let mut tx = s.begin_batch(OP).await?;
            let inserted = insert_steps_in((&mut *tx).into(), OP, &batch, now).await?;
            // Per finish: whether its rows stand, and those this transaction
            // inserted (nobody saw them yet: they go if it does not apply).
            let mut going = Vec::with_capacity(finishes.len());
            let mut mine = Vec::with_capacity(finishes.len());
            for rows in steps {
                let mut stands = true;
                let mut ours = Vec::new();
                for (row, _) in rows.iter() {
                    if inserted.contains(&(row.workflow_id.clone(), row.generation, row.seq)) {
                        ours.push(row);
                        continue;
                    }
                    let first = journaled_on((&mut *tx).into(), OP, row).await?;
                    // The same key, so equal rows mean the same kind, name
                    // and result.
                    stands &= first == *row;
                }
                going.push(stands);
                mine.push(ours);
            }
            let (apply, apply_hand_overs): (Vec<Finish<'_>>, Vec<Option<&HandOver>>) = finishes
                .iter()
                .zip(hand_overs)
                .zip(&going)
                .filter(|(_, stands)| **stands)
                .map(|((finish, hand_over), _)| (*finish, *hand_over))
                .unzip();
            let mut applied =
                finish_handing_over_on((&mut *tx).into(), &apply, &apply_hand_overs, now)
                    .await?
                    .into_iter();
            let mut finished = Vec::with_capacity(finishes.len());
            for (stands, ours) in going.into_iter().zip(mine) {
                let outcome = match stands {
                    true => applied.next().ok_or_else(|| StoreError::Corrupt {
                        what: "a batch of finishes returned too few outcomes".into(),
                    })?,
                    false => (false, None),
                };
                if !outcome.0 {
                    for row in ours {
                        delete_step_on((&mut *tx).into(), OP, row).await?;
                    }
                }
                finished.push(outcome);
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(finished)
        })
    }

    /// Records instances whose first run ended before they were recorded
    /// (short workflows awaited in the runtime that ran them): each is
    /// inserted and then finished as its `Finish` says, all in one
    /// transaction, so each costs a share of one commit instead of two. An
    /// id that exists already is left as it is and returned with `false`:
    /// that instance is another call's, and the finish is not applied to it.
    /// The rows returned for the created ones are as finished.
    pub async fn create_ended(
        &self,
        ended: &[(NewInstance<'_>, Finish<'_>)],
    ) -> Result<Vec<(InstanceRow, bool)>> {
        const OP: &str = "create_ended";
        for (new, finish) in ended {
            validate_id("workflow id", new.id)?;
            validate_id("workflow name", new.name)?;
            if finish.id != new.id || !finish.status.is_final() {
                return Err(StoreError::Corrupt {
                    what: format!(
                        "the end recorded with new instance `{}` is not a final end of it",
                        new.id
                    ),
                });
            }
        }
        let now = self.now_us();
        if let [(new, finish)] = ended {
            if let Some(outcome) = self.create_ended_alone(new, finish, now).await? {
                return Ok(vec![outcome]);
            }
        }
        dispatch!(Store, self, |s| {
            let mut tx = s.begin_batch(OP).await?;
            let mut outcomes = Vec::with_capacity(ended.len());
            let mut finishes = Vec::new();
            for (new, finish) in ended {
                let (row, created) = create_instance_on((&mut *tx).into(), new, now).await?;
                if created {
                    finishes.push(*finish);
                }
                outcomes.push((row, created));
            }
            let none = vec![None; finishes.len()];
            let finished = finish_handing_over_on((&mut *tx).into(), &finishes, &none, now).await?;
            if finished.iter().any(|(applied, _)| !applied) {
                // Inserted under the finishing owner's lease in this very
                // transaction: a finish that does not apply is a bug, and
                // nothing of it may commit.
                return Err(StoreError::Corrupt {
                    what: "an instance created to be finished refused its finish".into(),
                });
            }
            tx.commit().await.map_err(StoreError::query(OP))?;
            for ((row, created), (_, finish)) in outcomes.iter_mut().zip(ended) {
                if *created {
                    row.status = finish.status;
                    row.output = finish.output.map(str::to_owned);
                    row.error = finish.error.map(str::to_owned);
                    row.lease_owner = None;
                    row.lease_expires_at = None;
                    row.wake_at = None;
                    row.updated_at = now;
                }
            }
            Ok(outcomes)
        })
    }

    /// [`Store::create_ended`] of one instance without a parent or a
    /// deadline: one autocommitted statement (one round trip on PostgreSQL,
    /// one call to the connection's thread on SQLite, instead of a
    /// transaction's four), then a read of the existing row if the id was
    /// taken. `None` for any other instance (the caller records it in a
    /// transaction).
    async fn create_ended_alone(
        &self,
        new: &NewInstance<'_>,
        finish: &Finish<'_>,
        now: i64,
    ) -> Result<Option<(InstanceRow, bool)>> {
        const OP: &str = "create_ended";
        if new.parent.is_some() || new.deadline.is_some() {
            return Ok(None);
        }
        let values = args![
            new.id,
            new.name,
            finish.status.as_str(),
            new.input,
            now,
            new.signature,
            new.traceparent,
            new.app_version,
            new.skeleton_hash,
            finish.output,
            finish.error,
        ];
        let inserted = self
            .fetch_optional::<InstanceRow>(OP, |s| &s.insert_ended, &values)
            .await?;
        if let Some(row) = inserted {
            return Ok(Some((row, true)));
        }
        match self.get_instance(new.id).await? {
            Some(existing) => Ok(Some((existing, false))),
            None => Err(StoreError::Corrupt {
                what: format!(
                    "workflow instance `{}` conflicted on insert but cannot be read",
                    new.id
                ),
            }),
        }
    }

    /// Suspends a running instance `suspend.owner` holds, releasing the
    /// lease: it costs only its row until due at `suspend.wake_at` (never by
    /// time when `None`). When it awaits step `suspend.awaiting` (an awakeable
    /// or a child) and that step was recorded meanwhile, it is due at once
    /// instead. Returns whether it applied.
    pub async fn suspend(&self, suspend: &Suspend<'_>) -> Result<bool> {
        // Waiting on a step another transaction records (a child's end, an
        // answer): check it under the instance's row lock, in a statement
        // after taking it, so a result committed while this suspends is
        // never missed (on PostgreSQL one UPDATE's snapshot could miss it).
        if suspend.awaiting.is_some() {
            return self.suspend_for_any(suspend, &[], &[]).await;
        }
        let args = args![
            suspend.id,
            suspend.generation,
            suspend.owner,
            suspend.wake_at,
            self.now_us(),
            suspend.awaiting,
            suspend.waiting.map(|w| w.seq),
            suspend.waiting.map(|w| w.kind.as_str()),
            suspend.waiting.map(|w| w.name.as_str()),
        ];
        Ok(self.execute("suspend", |sql| &sql.suspend, &args).await? == 1)
    }

    /// Reads one recorded step.
    pub async fn get_step(&self, id: &str, generation: i64, seq: i64) -> Result<Option<StepRow>> {
        let args = args![id, generation, seq];
        self.fetch_optional("get_step", |sql| &sql.get_step, &args)
            .await
    }

    /// Records the resolution `row` of an awaitable created at step `created`
    /// of the same instance and generation (a step of kind `kind`), and makes
    /// a suspended waiter due, in one transaction. The first resolution wins;
    /// an instance that has ended (completed, failed, cancelled), or whose
    /// generation has, takes none ([`Resolution::Finished`],
    /// [`Resolution::Continued`]) unless it was resolved before.
    pub async fn resolve(&self, created: i64, kind: &str, row: &StepRow) -> Result<Resolution> {
        const OP: &str = "resolve";
        let now = self.now_us();
        dispatch!(Store, self, |s| {
            let mut tx = s.begin(OP).await?;
            let resolution = resolve_on((&mut *tx).into(), created, kind, row, now).await?;
            // Anything else wrote nothing: rolled back, its locks released.
            if resolution == Resolution::Recorded {
                tx.commit().await.map_err(StoreError::query(OP))?;
                Ok(resolution)
            } else {
                crate::query::rolled_back(tx, OP, resolution).await
            }
        })
    }

    /// Cancels an unfinished instance and its unfinished descendants in one
    /// transaction; each cancelled child reports to its parent.
    pub async fn cancel(&self, id: &str) -> Result<Cancellation> {
        const OP: &str = "cancel";
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let status: Option<String> = crate::prepared::query_scalar(&sql.status_for_cancel)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let Some(status) = status else {
                return crate::query::rolled_back(tx, OP, Cancellation::NotFound).await;
            };
            let status = rows::instance_status(id, &status)?;
            if status.is_final() {
                return crate::query::rolled_back(tx, OP, Cancellation::AlreadyFinal(status)).await;
            }
            let ended = end_tree((&mut *tx).into(), OP, id, InstanceStatus::Cancelled, now).await?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Cancellation::Cancelled(ended))
        })
    }

    /// Ends an unfinished instance whose deadline has passed, and its
    /// unfinished descendants, as [`InstanceStatus::TimedOut`] in one
    /// transaction, like [`Store::cancel`]: each reports to its parent.
    /// `Ok(None)` when the instance has no deadline or it has not passed yet.
    pub async fn time_out(&self, id: &str) -> Result<Option<Cancellation>> {
        const OP: &str = "time_out";
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            let row: Option<(String, Option<i64>)> =
                crate::prepared::query_as(&sql.status_for_time_out)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?;
            let Some((status, deadline)) = row else {
                return crate::query::rolled_back(tx, OP, Some(Cancellation::NotFound)).await;
            };
            let status = rows::instance_status(id, &status)?;
            if status.is_final() {
                return crate::query::rolled_back(tx, OP, Some(Cancellation::AlreadyFinal(status)))
                    .await;
            }
            if deadline.is_none_or(|deadline| deadline > now) {
                return crate::query::rolled_back(tx, OP, None).await;
            }
            let ended = end_tree((&mut *tx).into(), OP, id, InstanceStatus::TimedOut, now).await?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(Some(Cancellation::Cancelled(ended)))
        })
    }

    /// How many awakeables of unfinished instances have no answer yet.
    pub async fn count_pending_awakeables(&self) -> Result<u64> {
        let op = "count_pending_awakeables";
        self.count(op, |sql| &sql.count_pending_awakeables, &[])
            .await
    }

    /// Ends generation `next.generation` of an instance `next.owner` holds
    /// and starts the next with `next.input` and an empty journal, due now.
    /// Old steps are kept. Returns whether it applied.
    pub async fn continue_as_new(&self, next: &ContinueAsNew<'_>) -> Result<bool> {
        let args = args![
            next.id,
            next.generation,
            next.owner,
            next.input,
            self.now_us(),
            next.app_version,
        ];
        Ok(self
            .execute("continue_as_new", |sql| &sql.continue_as_new, &args)
            .await?
            == 1)
    }

    /// Puts an instance set aside for non-determinism back to `pending`, keeping
    /// its journal, so the fixed code can resume it. Returns whether it applied.
    /// Refused with [`StoreError::Duplicate`] when another unfinished
    /// instance took its queue's dedup key meanwhile.
    pub async fn requeue_set_aside(&self, id: &str) -> Result<bool> {
        crate::queue::twice_past_a_gone_holder(|| self.requeue_set_aside_once(id)).await
    }

    /// One try of [`Store::requeue_set_aside`].
    async fn requeue_set_aside_once(&self, id: &str) -> Result<bool> {
        if let Some(duplicate) = self.dedup_taken(id).await? {
            return Err(duplicate);
        }
        let args = args![id, self.now_us()];
        match self
            .execute("requeue_set_aside", |sql| &sql.requeue_set_aside, &args)
            .await
        {
            Ok(changed) => Ok(changed == 1),
            Err(error) => Err(self.key_taken_meanwhile(id, error).await),
        }
    }
}

/// Records a new instance on `conn`, or reads the existing one with its id
/// (the backend's insert-or-read).
pub(crate) async fn create_instance_on(
    conn: Conn<'_>,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)> {
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => crate::sqlite::journal::create_on(c, new, now).await,
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => crate::postgres::journal::create_on(c, new, now).await,
    }
}

/// Ends the unfinished instance `id` and its unfinished descendants with
/// `status` (cancelled or timed out), each reporting to its parent; returns
/// their ids, `id` first.
async fn end_tree(
    conn: Conn<'_>,
    op: &'static str,
    id: &str,
    status: InstanceStatus,
    now: i64,
) -> Result<Vec<String>> {
    let error = match status {
        InstanceStatus::TimedOut => "timed out at its deadline",
        _ => "cancelled",
    };
    dispatch!(Conn, conn, |c, sql| {
        let ids: Vec<String> = crate::prepared::query_scalar(&sql.unfinished_tree)
            .bind(id)
            .fetch_all(&mut *c)
            .await
            .map_err(StoreError::query(op))?;
        let mut ended_here = Vec::with_capacity(ids.len());
        for ended in ids {
            let changed = crate::prepared::query(&sql.cancel_one)
                .bind(&ended)
                .bind(now)
                .bind(status.as_str())
                .bind(error)
                .execute(&mut *c)
                .await
                .map_err(StoreError::query(op))?
                .rows_affected();
            // (A descendant that ended since the tree was read keeps its end.)
            if changed == 1 {
                report_to_parent((&mut *c).into(), &ended, now).await?;
                ended_here.push(ended);
            }
        }
        let mut ordered = vec![id.to_owned()];
        ordered.extend(ended_here.into_iter().filter(|e| e != id));
        Ok(ordered)
    })
}

/// [`Store::resolve`] on `conn` (a transaction the caller commits when it
/// returns [`Resolution::Recorded`]; anything else wrote nothing).
pub(crate) async fn resolve_on(
    conn: Conn<'_>,
    created: i64,
    kind: &str,
    row: &StepRow,
    now: i64,
) -> Result<Resolution> {
    const OP: &str = "resolve";
    dispatch!(Conn, conn, |c, sql| {
        let exists = crate::prepared::query(&sql.step_of_kind_exists)
            .bind(&row.workflow_id)
            .bind(row.generation)
            .bind(created)
            .bind(kind)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?
            .is_some();
        if !exists {
            return Ok(Resolution::Unknown);
        }
        // Locked (PostgreSQL; SQLite's write lock is held already) so a
        // cancel or finish cannot slip in between this check and the
        // insert: it waits for this transaction, or this one sees it.
        let current: Option<(String, i64)> = crate::prepared::query_as(&sql.status_for_answer)
            .bind(&row.workflow_id)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        let Some((status, generation)) = current else {
            return Ok(Resolution::Unknown);
        };
        let status = rows::instance_status(&row.workflow_id, &status)?;
        let ended = matches!(
            status,
            InstanceStatus::Completed
                | InstanceStatus::Failed
                | InstanceStatus::Cancelled
                | InstanceStatus::TimedOut
        );
        if ended || generation != row.generation {
            // An answer given before the end still stands, and says so.
            let first = get_step_on(
                (&mut *c).into(),
                OP,
                &row.workflow_id,
                row.generation,
                row.seq,
            )
            .await?;
            return Ok(match first {
                Some(first) => Resolution::AlreadyResolved(first),
                None if generation != row.generation => Resolution::Continued(generation),
                None => Resolution::Finished(status),
            });
        }
        if !insert_step_on((&mut *c).into(), OP, row, now).await? {
            let first = journaled_on((&mut *c).into(), OP, row).await?;
            return Ok(Resolution::AlreadyResolved(first));
        }
        crate::prepared::query(&sql.wake_suspended)
            .bind(&row.workflow_id)
            .bind(row.generation)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(StoreError::query(OP))?;
        Ok(Resolution::Recorded)
    })
}

/// Reads one recorded step on `conn`.
pub(crate) async fn get_step_on(
    conn: Conn<'_>,
    op: &'static str,
    id: &str,
    generation: i64,
    seq: i64,
) -> Result<Option<StepRow>> {
    dispatch!(Conn, conn, |c, sql| {
        let row = crate::prepared::query(&sql.get_step)
            .bind(id)
            .bind(generation)
            .bind(seq)
            .fetch_optional(c)
            .await
            .map_err(StoreError::query(op))?;
        row.as_ref().map(StepRow::from_row).transpose()
    })
}

/// Removes step `row`'s id from the journal on `conn`: only for a row the
/// same transaction inserted, which nobody has seen.
async fn delete_step_on(conn: Conn<'_>, op: &'static str, row: &StepRow) -> Result<()> {
    dispatch!(Conn, conn, |c, sql| {
        crate::prepared::query(&sql.delete_step)
            .bind(&row.workflow_id)
            .bind(row.generation)
            .bind(row.seq)
            .execute(c)
            .await
            .map_err(StoreError::query(op))?;
        Ok(())
    })
}

/// The row journaled under `row`'s step id, which an insert of `row` just
/// found taken: an error if it cannot be read.
pub(crate) async fn journaled_on(
    conn: Conn<'_>,
    op: &'static str,
    row: &StepRow,
) -> Result<StepRow> {
    get_step_on(conn, op, &row.workflow_id, row.generation, row.seq)
        .await?
        .ok_or_else(|| unreadable_step(row))
}

/// Journals `step` on `conn` unless its step id is journaled; returns the
/// row recorded first when it was (then nothing is to be written with it).
pub(crate) async fn journal_once(
    conn: Conn<'_>,
    op: &'static str,
    step: &StepRow,
    now: i64,
) -> Result<Option<StepRow>> {
    dispatch!(Conn, conn, |c| {
        if insert_step_on((&mut *c).into(), op, step, now).await? {
            return Ok(None);
        }
        let first = journaled_on(c.into(), op, step).await?;
        Ok(Some(first))
    })
}

/// Inserts `batch` on `conn`, a transaction, with the backend's multi-row
/// statement, keeping any step id already journaled; returns the step ids
/// it inserted.
async fn insert_steps_in(
    conn: Conn<'_>,
    op: &'static str,
    batch: &[(&StepRow, StepTiming)],
    now: i64,
) -> Result<std::collections::HashSet<(String, i64, i64)>> {
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => crate::sqlite::journal::insert_steps_on(c, op, batch, now).await,
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => Ok(crate::postgres::journal::insert_steps_on(c, op, batch, now)
            .await?
            .into_iter()
            .collect()),
    }
}

/// Records one step on `conn` unless its step id is recorded; returns whether
/// it was.
pub(crate) async fn insert_step_on(
    conn: Conn<'_>,
    op: &'static str,
    row: &StepRow,
    now: i64,
) -> Result<bool> {
    let inserted = dispatch!(Conn, conn, |c, sql| bind_all!(
        crate::prepared::query(&sql.insert_step),
        &step_args(row, now)
    )
    .execute(c)
    .await
    .map(|done| done.rows_affected()));
    Ok(inserted.map_err(StoreError::query(op))? == 1)
}

/// The error for a step that conflicted on insert but cannot be read back.
pub(crate) fn unreadable_step(row: &StepRow) -> StoreError {
    StoreError::Corrupt {
        what: format!(
            "step {} of workflow instance `{}` (generation {}) keeps conflicting on insert but \
             cannot be read back",
            row.seq, row.workflow_id, row.generation
        ),
    }
}

/// The parameters of the `finish` statement (and of PostgreSQL's lone
/// finish) for `finish` at `now`.
pub(crate) fn finish_args<'a>(finish: &Finish<'a>, now: i64) -> [Arg<'a>; 7] {
    args![
        finish.id,
        finish.generation,
        finish.owner,
        finish.status.as_str(),
        finish.output,
        finish.error,
        now,
    ]
}

/// [`Store::finish_handing_over`] in `conn`, a transaction its caller
/// commits: several finishes of distinct instances with the backend's one
/// batch statement, else one by one; then each applied finish's hand-over.
async fn finish_handing_over_on(
    mut conn: Conn<'_>,
    finishes: &[Finish<'_>],
    hand_overs: &[Option<&HandOver>],
    now: i64,
) -> Result<Vec<(bool, Option<InstanceRow>)>> {
    // Whether each applied, and (from the batch statement) its partition.
    let (applied, partitions): (Vec<bool>, Option<Vec<Option<String>>>) =
        if finishes.len() > 1 && distinct_ids(finishes) {
            let partitions = match conn.reborrow() {
                #[cfg(feature = "sqlite")]
                Conn::Sqlite(c) => crate::sqlite::journal::finish_many_on(c, finishes, now).await?,
                #[cfg(feature = "postgres")]
                Conn::Postgres(c) => {
                    crate::postgres::PostgresStore::finish_many_on(c, finishes, now).await?
                }
            };
            (
                partitions.iter().map(Option::is_some).collect(),
                Some(partitions),
            )
        } else {
            let mut applied = Vec::with_capacity(finishes.len());
            for finish in finishes {
                applied.push(finish_on(conn.reborrow(), finish, now).await?);
            }
            (applied, None)
        };
    // The applied finishes' hand-overs, together.
    let mut handing = Vec::new();
    let mut at = Vec::new();
    for (i, (finish, hand_over)) in finishes.iter().zip(hand_overs).enumerate() {
        if let (Some(hand_over), true) = (hand_over, applied[i]) {
            let partition = partitions.as_ref().and_then(|p| p[i].as_deref());
            handing.push(crate::queue::Handing {
                finish,
                hand_over,
                partition,
            });
            at.push(i);
        }
    }
    let mut finished: Vec<(bool, Option<InstanceRow>)> =
        applied.into_iter().map(|applied| (applied, None)).collect();
    if !handing.is_empty() {
        let successors = crate::queue::hand_over_all_on(conn, &handing, now).await?;
        for (i, successor) in at.into_iter().zip(successors) {
            finished[i].1 = successor;
        }
    }
    Ok(finished)
}

/// Moves an unfinished instance to a final status and reports to its parent.
async fn finish_on(conn: Conn<'_>, finish: &Finish<'_>, now: i64) -> Result<bool> {
    dispatch!(Conn, conn, |c, sql| {
        let updated: Option<bool> = bind_all!(
            crate::prepared::query_scalar(&sql.finish),
            &finish_args(finish, now)
        )
        .fetch_optional(&mut *c)
        .await
        .map_err(StoreError::query("finish"))?;
        // Only a child reports to a parent; most instances have none.
        if updated == Some(true) {
            report_to_parent(c.into(), finish.id, now).await?;
        }
        Ok(updated.is_some())
    })
}

/// The outcome of each of a batch of creates, in batch order, from the rows
/// of its ids (each with whether the batch inserted it): of two creates of
/// one id in the batch, the first created it and the second finds it.
pub(crate) fn in_batch_order(
    news: &[NewInstance<'_>],
    mut rows: std::collections::HashMap<String, (InstanceRow, bool)>,
) -> Result<Vec<(InstanceRow, bool)>> {
    let mut outcomes = Vec::with_capacity(news.len());
    for new in news {
        let Some((row, created)) = rows.get_mut(new.id) else {
            return Err(StoreError::Corrupt {
                what: format!(
                    "workflow instance `{}` conflicted on insert but cannot be read",
                    new.id
                ),
            });
        };
        outcomes.push((row.clone(), *created));
        *created = false;
    }
    Ok(outcomes)
}

/// Whether no two of `finishes` name the same instance (one statement can
/// finish them all: a row matched twice by an `UPDATE .. FROM` is updated
/// once, by whichever match comes first).
fn distinct_ids(finishes: &[Finish<'_>]) -> bool {
    distinct(finishes.iter().map(|f| f.id).collect())
}

/// Sorts `batch` by step id: every writer inserts in that order, so two
/// batches that overlap (on PostgreSQL, from two processes) wait on each
/// other in one direction and never deadlock.
fn in_step_id_order(batch: &mut [(&StepRow, StepTiming)]) {
    batch.sort_unstable_by(|(a, _), (b, _)| {
        (&a.workflow_id, a.generation, a.seq).cmp(&(&b.workflow_id, b.generation, b.seq))
    });
}

/// Whether no two of `keys` are equal.
fn distinct<T: Ord>(mut keys: Vec<T>) -> bool {
    keys.sort_unstable();
    keys.windows(2).all(|pair| pair[0] != pair[1])
}

/// Records a child's end in its parent's journal (the step the parent awaits,
/// as an [`crate::Outcome`]) and makes a suspended parent due; nothing for an
/// instance without a parent.
pub(crate) async fn report_to_parent(conn: Conn<'_>, child: &str, now: i64) -> Result<()> {
    dispatch!(Conn, conn, |c, sql| {
        for statement in [&sql.report_child, &sql.wake_parent] {
            crate::prepared::query(statement)
                .bind(child)
                .bind(now)
                .execute(&mut *c)
                .await
                .map_err(StoreError::query("report_to_parent"))?;
        }
        Ok(())
    })
}

/// The parameters of [`crate::sql::Statements::insert_instance`] for `new`:
/// pending, or running under its lease when it has one.
pub(crate) fn new_instance_args<'a>(new: &NewInstance<'a>, now: i64) -> [Arg<'a>; 15] {
    let (status, owner, expires) = match new.lease {
        Some(lease) => (
            InstanceStatus::Running,
            Some(lease.owner),
            Some(now + lease.ttl_us),
        ),
        None => (InstanceStatus::Pending, None, None),
    };
    args![
        new.id,
        new.name,
        status.as_str(),
        new.input,
        owner,
        expires,
        new.parent.map(|p| p.id),
        new.parent.map(|p| p.seq),
        now,
        new.parent.map(|p| p.generation),
        new.signature,
        new.deadline,
        new.traceparent,
        new.app_version,
        new.skeleton_hash,
    ]
}

/// The parameters recording `row` at `now`: its step id, name, kind, result
/// and creation time.
pub(crate) fn step_args(row: &StepRow, now: i64) -> [Arg<'_>; 7] {
    args![
        &row.workflow_id,
        row.generation,
        row.seq,
        &row.name,
        &row.kind,
        &row.result,
        now,
    ]
}
