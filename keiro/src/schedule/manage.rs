//! The management calls on [`Keiro`]: list, pause, resume, trigger,
//! backfill, and dynamic schedules made and deleted at run time. Every one
//! goes through the schedules table, so every worker of the database sees it.

use std::time::SystemTime;

use keiro_store::{ScheduleDef, ScheduleRow};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::fire::{fire, fire_as, Start};
use super::info::ScheduleInfo;
use super::registration::{linked, CronRegistration};
use super::spec::{rfc3339, CronSpec, DEFAULT_TIMEZONE};
use crate::time::{from_us, to_us};
use crate::{Error, Keiro, Result, WorkflowCall};

/// The most [`Keiro::trigger_schedule`] runs of one schedule at one
/// instant of the store's clock.
const MAX_TRIGGERS_AT_ONCE: u32 = 100;

/// The most ticks one [`Keiro::backfill_schedule`] call creates.
pub const MAX_BACKFILL_TICKS: usize = 10_000;

/// At a resume worker's start: writes every `#[workflow(cron)]` schedule
/// linked into this binary to the table (new ones, and changed definitions:
/// the most recently started worker's stands), keeping paused state and
/// last tick, and deletes the schedule of a workflow this binary links
/// without the attribute (a newer or older version of the code has none).
/// A `#[workflow(cron)]` schedule whose name a dynamic schedule holds does
/// not run, and is logged as an error.
pub(crate) async fn write_linked(keiro: &Keiro) -> Result<()> {
    let store = keiro.raw_store();
    for registration in linked() {
        let def = ScheduleDef {
            latest_tick: latest_tick(keiro, registration.cron, registration.timezone),
            ..static_def(registration)
        };
        store.put_schedule(&def).await?;
    }
    // A row that does not read is the scheduler's to report.
    for row in store.schedules_each().await?.into_iter().flatten() {
        let here = declared(&row.name);
        if row.input.is_some() && here {
            tracing::error!(
                schedule = %row.name,
                "keiro's `#[workflow(cron)]` schedule `{}` does not run: a dynamic schedule \
                 of that name (made with `create_schedule`) holds it; delete that one with \
                 `delete_schedule`, and the next worker to start writes this one",
                row.name
            );
        } else if row.input.is_none()
            && !here
            && row.name == row.workflow
            && keiro.registry().get(&row.workflow).is_some()
            && store.delete_static_schedule(&row.name).await?
        {
            tracing::info!(
                schedule = %row.name,
                "keiro deleted the schedule of workflow `{}`: this binary declares it without \
                 `#[workflow(cron)]`",
                row.name
            );
        }
    }
    Ok(())
}

/// Writes `#[workflow(cron)]` schedule `name`, if this binary declares it
/// and the table lacks it, so a call operating on it (pause, trigger, …)
/// finds it before any worker started; an existing row, whatever its
/// definition, is left as the workers wrote it (this process may run an
/// older or newer version).
///
/// The row's write time is its making, from which a worker starting later
/// counts missed ticks: it is the agreed clock's (the database server's on
/// PostgreSQL), as this process need not be a worker whose clock is
/// checked.
async fn add_declared(keiro: &Keiro, name: &str) -> Result<()> {
    if let Some(registration) = linked().find(|registration| registration.workflow == name) {
        let now = keiro.agreed_now_us().await;
        keiro
            .raw_store()
            .add_static_schedule_at(&static_def(registration), now)
            .await?;
    }
    Ok(())
}

/// What is known of a schedule: `row`'s definition, paused state and last
/// tick, with its next tick after `now`.
fn info(row: ScheduleRow, now: i64) -> ScheduleInfo {
    let (next_tick, problem) = match (
        row.paused,
        CronSpec::parse(&row.name, &row.cron, &row.timezone),
    ) {
        (false, Ok(spec)) => (spec.next_after(now).map(from_us), None),
        (true, Ok(_)) => (None, None),
        (_, Err(error)) => (None, Some(error.to_string())),
    };
    ScheduleInfo {
        problem,
        dynamic: row.input.is_some(),
        last_tick: row.last_tick.map(from_us),
        next_tick,
        name: row.name,
        workflow: row.workflow,
        cron: row.cron,
        timezone: row.timezone,
        paused: row.paused,
    }
}

/// The stored definition of a `#[workflow(cron)]` schedule.
fn static_def(registration: &'static CronRegistration) -> ScheduleDef<'static> {
    ScheduleDef {
        name: registration.workflow,
        cron: registration.cron,
        timezone: registration.timezone,
        workflow: registration.workflow,
        input: None,
        latest_tick: None,
    }
}

/// The latest tick of `cron` read in `timezone` at or before `keiro`'s now,
/// if it parses and has one: what a changed definition records as passed
/// over (see [`ScheduleDef::latest_tick`]).
fn latest_tick(keiro: &Keiro, cron: &str, timezone: &str) -> Option<i64> {
    CronSpec::parse("", cron, timezone)
        .ok()?
        .latest_until(keiro.now_us())
}

/// Whether this binary declares `#[workflow(cron)]` schedule `name`.
pub(crate) fn declared(name: &str) -> bool {
    linked().any(|registration| registration.workflow == name)
}

impl Keiro {
    /// Every schedule of this database, by name: the `#[workflow(cron)]`
    /// ones written by any worker and the dynamic ones, each with its next
    /// tick by this process's clock, and the `#[workflow(cron)]` ones this
    /// binary declares that no worker has written yet, as declared. A
    /// `#[workflow(cron)]` schedule shows the definition of the most
    /// recently started worker declaring it. Listing writes nothing, so a
    /// dashboard of an older or newer version changes no schedule. A row
    /// that does not read (a hand-edited column) is left out and logged;
    /// one whose expression or time zone does not parse is listed with its
    /// [`ScheduleInfo::problem`].
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        let now = self.now_us();
        // A row that does not read is left out (and logged), as the
        // scheduler skips it: the others are still listed.
        let mut listed = Vec::new();
        for row in self.raw_store().schedules_each().await? {
            match row {
                Ok(row) => listed.push(info(row, now)),
                Err(error) => tracing::error!(
                    %error,
                    "keiro leaves a schedule it cannot read out of the listing; fix the row, \
                     or delete it with `delete_schedule`"
                ),
            }
        }
        for registration in linked() {
            if listed.iter().all(|s| s.name != registration.workflow) {
                let def = static_def(registration);
                let row = ScheduleRow {
                    name: def.name.to_owned(),
                    cron: def.cron.to_owned(),
                    timezone: def.timezone.to_owned(),
                    workflow: def.workflow.to_owned(),
                    input: None,
                    paused: false,
                    last_tick: None,
                    updated_at: now,
                };
                listed.push(info(row, now));
            }
        }
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listed)
    }

    /// Pauses schedule `name` on every worker (within half a second): no
    /// tick runs until [`Keiro::resume_schedule`], and ticks that fall
    /// meanwhile are not run later. An unknown name is
    /// [`Error::UnknownSchedule`].
    pub async fn pause_schedule(&self, name: &str) -> Result<()> {
        self.set_paused(name, true).await
    }

    /// Resumes a paused schedule `name`: its next tick after now runs. The
    /// ticks that fell while it was paused are passed over for good: the
    /// latest becomes its `last_tick`, so a worker starting later does not
    /// run it as missed. Which ticks fell is judged by the database
    /// server's clock on PostgreSQL, so a resume from a host whose clock
    /// runs ahead passes over no tick still to come.
    pub async fn resume_schedule(&self, name: &str) -> Result<()> {
        self.set_paused(name, false).await
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<()> {
        let row = self.schedule_row(name).await?;
        let store = self.raw_store();
        // The write's time is a running scheduler's sign that the row
        // changed, and the agreed clock's like every management write.
        let now = self.agreed_now_us().await;
        let found = if paused || !row.paused {
            store.set_schedule_paused_at(name, paused, now).await?
        } else {
            // The ticks that fell while paused are passed over: the latest
            // is recorded as handled in the statement that resumes it, so a
            // worker starting then does not run it as a missed tick.
            let spec = CronSpec::parse(&row.name, &row.cron, &row.timezone)?;
            let latest = spec.latest_until(now);
            store.unpause_schedule_at(name, latest, now).await?
        };
        if !found {
            return Err(self.unknown_schedule(name).await);
        }
        self.scheduler_state().wake();
        Ok(())
    }

    /// Runs schedule `name` once now (paused or not; not a tick, so a missed
    /// tick still runs as missed after it), as a run at the
    /// store's current time, under the id `cron:<name>:trigger:<now, RFC
    /// 3339>` (with `-2`, `-3`, … for more triggers at the same instant, as
    /// on a test clock standing still). Returns the instance id; whichever resume worker serving the
    /// workflow claims it runs it.
    pub async fn trigger_schedule(&self, name: &str) -> Result<String> {
        let row = self.schedule_row(name).await?;
        let now = self.now_us();
        let base = format!("cron:{name}:trigger:{}", rfc3339(now));
        // A second trigger within the same microsecond (a test's clock that
        // stands still) gets the next free `-2`, `-3`, … rather than the
        // first one's instance.
        for n in 1..=MAX_TRIGGERS_AT_ONCE {
            let id = match n {
                1 => base.clone(),
                n => format!("{base}-{n}"),
            };
            if fire_as(self, &row, now, id.clone(), Start::Pending).await? {
                return Ok(id);
            }
        }
        Err(Error::InvalidSchedule {
            name: name.to_owned(),
            reason: format!(
                "it was triggered {MAX_TRIGGERS_AT_ONCE} times at {}; let the clock move on",
                rfc3339(now)
            ),
        })
    }

    /// Starts every tick of schedule `name` from `from` to `to` (both
    /// included) that has no instance yet, each under its tick's own id, so
    /// a tick the scheduler ran already, or an earlier backfill, is not run
    /// again. Returns the ids of the instances it created, in tick order. A
    /// tick whose id another workflow's instance holds (the schedule ran
    /// another workflow before it was made again) cannot start: it is
    /// passed over with a warning, and the others start. A store error
    /// stops the backfill with the ticks before it created: the same call
    /// again creates the rest (and returns only those). At
    /// most [`MAX_BACKFILL_TICKS`] ticks per call; more, a range that ends
    /// after now (by the database server's clock on PostgreSQL: those
    /// ticks are the scheduler's) or
    /// one that ends before it starts is [`Error::InvalidOption`].
    pub async fn backfill_schedule(
        &self,
        name: &str,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Vec<String>> {
        let row = self.schedule_row(name).await?;
        let spec = CronSpec::parse(&row.name, &row.cron, &row.timezone)?;
        let (from_us, to_us, now) = (to_us(from), to_us(to), self.agreed_now_us().await);
        if from_us > to_us {
            return Err(Error::invalid_option(
                "backfill_schedule",
                format!(
                    "the range of schedule `{name}` starts at {} after it ends at {}; \
                     pass the earlier time first",
                    rfc3339(from_us),
                    rfc3339(to_us)
                ),
            ));
        }
        if to_us > now {
            return Err(Error::invalid_option(
                "backfill_schedule",
                format!(
                    "the range of schedule `{name}` ends at {}, after now ({}): a backfill runs \
                     past ticks only, and the scheduler runs the rest when they fall due",
                    rfc3339(to_us),
                    rfc3339(now)
                ),
            ));
        }
        let ticks = spec.ticks_within(from_us, to_us, MAX_BACKFILL_TICKS + 1);
        if ticks.len() > MAX_BACKFILL_TICKS {
            return Err(Error::invalid_option(
                "backfill_schedule",
                format!(
                    "schedule `{name}` has more than {MAX_BACKFILL_TICKS} ticks in the range; \
                     backfill it in shorter ranges"
                ),
            ));
        }
        let mut created = Vec::new();
        for tick in ticks {
            match fire(self, &row, tick, Start::Pending).await {
                Ok(true) => created.push(super::spec::tick_id(name, tick)),
                Ok(false) => {}
                // Its id is another workflow's instance (one the schedule
                // ran before it was made again with another workflow): the
                // tick cannot start, as the scheduler would pass it over;
                // the range's other ticks still can.
                Err(error @ Error::IdConflict { .. }) => tracing::warn!(
                    %error,
                    schedule = %name,
                    tick = %rfc3339(tick),
                    "keiro's backfill passes over a tick it cannot start"
                ),
                Err(error) => return Err(error),
            }
        }
        Ok(created)
    }

    /// Makes (or redefines) dynamic schedule `name`: at each tick of `cron`
    /// (seconds field first, read in UTC) a worker linking `call`'s workflow
    /// starts it with `call`'s arguments, under the id
    /// `cron:<name>:<tick, RFC 3339>`. `call`'s own id, if any, is not used.
    /// Stored in the database, so every worker sees it; redefining keeps its
    /// paused state, and a new expression's latest tick until now counts as
    /// passed over (no worker runs it as missed). A malformed expression, one
    /// with no tick after now, and a name holding a `:` are
    /// [`Error::InvalidSchedule`]; a name held by a `#[workflow(cron)]`
    /// schedule is refused the same way. A
    /// call given queue, debounce, timeout or deadline settings, which the
    /// schedule would not keep, is [`Error::InvalidOption`].
    pub async fn create_schedule<R>(
        &self,
        name: &str,
        cron: &str,
        call: WorkflowCall<R>,
    ) -> Result<()>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        self.create_schedule_in(name, cron, DEFAULT_TIMEZONE, call)
            .await
    }

    /// [`Keiro::create_schedule`] with the expression read in `timezone`
    /// (an IANA name such as `Europe/Berlin`).
    pub async fn create_schedule_in<R>(
        &self,
        name: &str,
        cron: &str,
        timezone: &str,
        call: WorkflowCall<R>,
    ) -> Result<()>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        let spec = CronSpec::parse_new(name, cron, timezone)?;
        let now = self.agreed_now_us().await;
        if spec.next_after(now).is_none() {
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: format!(
                    "`{cron}` (in {timezone}) has no tick after now, so it would never run; \
                     check the day and month fields"
                ),
            });
        }
        call.refuse_for_schedule(name)?;
        if name.contains(':') {
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: "the name holds a `:`, which separates the parts of the ids its ticks \
                         and triggers run under (`cron:<name>:<tick>`, \
                         `cron:<name>:trigger:<time>`), so two schedules' ids could meet; \
                         choose a name without one (`-`, `.` and `/` are fine)"
                    .to_owned(),
            });
        }
        // Room for the longest id derived from it, a trigger's:
        // `cron:<name>:trigger:<RFC 3339 with µs>-<n>`.
        Error::check_id_within(
            "schedule name",
            name,
            crate::MAX_ID_BYTES - "cron::trigger:2000-01-01T00:00:00.000000Z-100".len(),
        )?;
        if declared(name) {
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: "the name is taken by a `#[workflow(cron)]` schedule; choose another"
                    .to_owned(),
            });
        }
        let input = call.encoded_input()?;
        let written = self
            .raw_store()
            .put_schedule_at(
                &ScheduleDef {
                    name,
                    cron,
                    timezone,
                    workflow: call.name,
                    input: Some(&input),
                    latest_tick: spec.latest_until(now),
                },
                now,
            )
            .await?;
        if !written {
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: "the name is taken by a `#[workflow(cron)]` schedule, declared by \
                         another binary on this database; choose another"
                    .to_owned(),
            });
        }
        self.scheduler_state().wake();
        Ok(())
    }

    /// Deletes dynamic schedule `name`: this process's schedulers stop at
    /// once, other processes' at their next read of the table (within half
    /// a second), so a tick falling before then may still start; instances
    /// already started are left alone. An unknown name is
    /// [`Error::UnknownSchedule`]; a `#[workflow(cron)]` schedule this
    /// binary declares cannot be deleted ([`Error::InvalidSchedule`]: pause
    /// it instead). One it does not declare (its workflow was renamed or
    /// removed, or its attribute dropped) can: a worker declaring it writes
    /// it again when it starts. A row that does not read (a hand-edited
    /// column, which every scheduler skips) is deleted whatever it held.
    pub async fn delete_schedule(&self, name: &str) -> Result<()> {
        let row = match self.schedule_row(name).await {
            Ok(row) => Some(row),
            // This row does not read (a hand-edited column): it can go, the
            // schedulers skip it meanwhile, and a worker declaring it writes
            // it anew when it starts. (Another row that does not read is no
            // error of this name's: see `unknown_schedule`.)
            Err(Error::Store(keiro_store::StoreError::Corrupt { .. })) => None,
            Err(error) => return Err(error),
        };
        if row.is_some_and(|row| row.input.is_none()) && declared(name) {
            return Err(Error::InvalidSchedule {
                name: name.to_owned(),
                reason: "it is declared by `#[workflow(cron)]` and comes back with the next \
                         worker; pause it with `pause_schedule` instead"
                    .to_owned(),
            });
        }
        self.raw_store().delete_schedule(name).await?;
        self.scheduler_state().wake();
        Ok(())
    }

    /// Now, for a call that judges which ticks have fallen (a resume or a
    /// redefinition passes them over, a backfill runs only past ones): on
    /// PostgreSQL by the database server's clock, read now, since the
    /// calling process (the `keiro` command on an operator's laptop, a web
    /// service that only manages schedules) takes no executor identity and
    /// so no check of its own clock, and one running ahead would pass over
    /// a tick that has not fallen yet. This process's clock on SQLite, under
    /// a manual clock, or when the reading fails (the call's own write then
    /// meets the store's trouble).
    async fn agreed_now_us(&self) -> i64 {
        let now = self.now_us();
        if self.raw_store().clock().is_manual() {
            return now;
        }
        match self.raw_store().read_server_clock().await {
            Ok(Some(reading)) => now.saturating_sub(reading.offset_us),
            Ok(None) | Err(_) => now,
        }
    }

    /// The stored schedule `name`, or [`Error::UnknownSchedule`].
    async fn schedule_row(&self, name: &str) -> Result<ScheduleRow> {
        if let Some(row) = self.raw_store().schedule_named(name).await? {
            return Ok(row);
        }
        add_declared(self, name).await?;
        match self.raw_store().schedule_named(name).await? {
            Some(row) => Ok(row),
            None => Err(self.unknown_schedule(name).await),
        }
    }

    /// [`Error::UnknownSchedule`] for `name`, listing the schedules that
    /// read (a row that does not, another schedule's, leaves the error
    /// about `name`).
    async fn unknown_schedule(&self, name: &str) -> Error {
        let known = match self.raw_store().schedules_each().await {
            Ok(rows) => rows
                .into_iter()
                .filter_map(|row| row.ok().map(|row| row.name))
                .collect::<Vec<_>>(),
            Err(error) => return error.into(),
        };
        Error::UnknownSchedule {
            name: name.to_owned(),
            known: known_names(&known),
        }
    }
}

/// The most schedule names an [`Error::UnknownSchedule`] lists.
const KNOWN_LISTED: usize = 20;

/// `known` for an error message: `none`, or the first [`KNOWN_LISTED`]
/// names and how many more there are (a database may hold thousands of
/// dynamic schedules).
fn known_names(known: &[String]) -> String {
    match known.len() {
        0 => "none".to_owned(),
        n if n <= KNOWN_LISTED => known.join(", "),
        n => format!(
            "{} and {} more",
            known[..KNOWN_LISTED].join(", "),
            n - KNOWN_LISTED
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_schedule_lists_at_most_twenty_known_names() {
        assert_eq!(known_names(&[]), "none");
        let names: Vec<String> = (0..25).map(|n| format!("s{n}")).collect();
        let listed = known_names(&names);
        assert!(
            listed.starts_with("s0, s1,") && listed.ends_with("s19 and 5 more"),
            "{listed}"
        );
        assert_eq!(known_names(&names[..2]), "s0, s1");
    }
}
