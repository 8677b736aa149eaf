//! The scheduler loop each resume worker runs beside its claim loop: it
//! reads the schedules table, and at each tick (by the store's clock) of a
//! schedule whose workflow this binary links, creates the tick's instance
//! under this process's lease and starts driving it at once. Every worker
//! does so; the tick's derived id makes it one instance, run by its creator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use keiro_store::ScheduleRow;
use tokio::sync::Notify;

use super::fire::{fire, Start};
use super::info::MissedTicks;
use super::spec::CronSpec;
use super::tick_runs::TickRuns;
use crate::{Keiro, Result};

/// The longest pause between two reads of the schedules table, so a
/// schedule created, paused or resumed by another process is seen within it.
pub(crate) const SCHEDULE_POLL: Duration = Duration::from_millis(500);

/// How late a tick may be and still run as due: a tick more than this
/// behind the scheduler's now (it was held up: a suspended machine, a store
/// out of reach, or one refusing the tick's start for longer) is a missed
/// tick, and [`MissedTicks`] decides, as at start-up.
pub(crate) const LATE_AFTER: Duration = Duration::from_secs(60);

/// The most ticks of one schedule created in one pass (the ticks of the last
/// [`LATE_AFTER`], at most one a second, stay below it).
const MAX_CATCH_UP: usize = 100;

/// What this process's schedulers share with the runtime: how to wake them
/// and what they have done, so [`crate::testing::TestEnv`] can tell when a
/// tick is due and when they have caught up.
#[derive(Debug)]
pub(crate) struct SchedulerState {
    wake: Notify,
    /// Wake-ups asked for.
    requested: AtomicU64,
    /// The `requested` count the latest finished pass started after.
    done: AtomicU64,
    /// The earliest next tick over the schedules a scheduler follows (µs),
    /// `i64::MAX` for none.
    next_tick: AtomicI64,
    /// How many schedulers run.
    running: AtomicUsize,
}

impl Default for SchedulerState {
    fn default() -> Self {
        SchedulerState {
            wake: Notify::new(),
            requested: AtomicU64::new(0),
            done: AtomicU64::new(0),
            next_tick: AtomicI64::new(i64::MAX),
            running: AtomicUsize::new(0),
        }
    }
}

impl SchedulerState {
    /// Makes every scheduler of this process read the table again now.
    pub(crate) fn wake(&self) {
        self.requested.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// The earliest next tick a running scheduler waits for (read by the
    /// SQLite-backed test environment).
    #[cfg(feature = "sqlite")]
    pub(crate) fn next_tick(&self) -> Option<i64> {
        let running = self.running.load(Ordering::SeqCst) > 0;
        let next = self.next_tick.load(Ordering::SeqCst);
        (running && next != i64::MAX).then_some(next)
    }

    /// Whether a running scheduler has not yet finished a pass since the
    /// latest [`SchedulerState::wake`].
    #[cfg(feature = "sqlite")]
    pub(crate) fn is_behind(&self) -> bool {
        self.running.load(Ordering::SeqCst) > 0
            && self.done.load(Ordering::SeqCst) < self.requested.load(Ordering::SeqCst)
    }
}

/// Where one schedule stands in this scheduler.
struct Cursor {
    /// The definition the spec was parsed from.
    definition: (String, String),
    spec: CronSpec,
    /// Every tick at or before this was handled.
    handled: i64,
    /// The missed tick start-up runs (see [`MissedTicks::RunLatest`]) while
    /// the store refuses its start: tried again at each pass until it is.
    missed: Option<i64>,
    /// The row's `updated_at` when a pass last read it: a write since
    /// (a resume, a redefinition) may have recorded a tick passed over.
    seen: i64,
}

/// Starts a scheduler task, which runs until it is aborted (with its resume
/// worker), starting the ticks it creates on `runs`. It counts as running,
/// and behind, from this call on, so a [`crate::testing::TestEnv`] waits for
/// its first pass.
pub(crate) fn spawn(
    keiro: &Keiro,
    missed: MissedTicks,
    runs: std::sync::Arc<TickRuns>,
) -> tokio::task::JoinHandle<()> {
    let state = keiro.scheduler_state();
    state.running.fetch_add(1, Ordering::SeqCst);
    state.requested.fetch_add(1, Ordering::SeqCst);
    let running = Running(keiro.clone());
    tokio::spawn(run(keiro.clone(), missed, runs, running))
}

async fn run(keiro: Keiro, missed: MissedTicks, runs: std::sync::Arc<TickRuns>, _running: Running) {
    let state = keiro.scheduler_state();
    let mut cursors: HashMap<String, Cursor> = HashMap::new();
    let mut notices = Notices::default();
    let mut first = true;
    loop {
        let seen = state.requested.load(Ordering::SeqCst);
        let next = match pass(&keiro, &runs, &mut cursors, &mut notices, missed, first).await {
            Ok(Pass::Done(next)) => {
                first = false;
                next
            }
            Ok(Pass::ClockOff) => None,
            Err(error) => {
                tracing::warn!(%error, "keiro's cron scheduler could not read its schedules");
                None
            }
        };
        state
            .next_tick
            .store(next.unwrap_or(i64::MAX), Ordering::SeqCst);
        state.done.fetch_max(seen, Ordering::SeqCst);
        let pause = match next {
            Some(at) => crate::time::until_us(at, keiro.now_us()).min(SCHEDULE_POLL),
            None => SCHEDULE_POLL,
        };
        let woken = state.wake.notified();
        if state.requested.load(Ordering::SeqCst) != seen {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = woken => {}
        }
    }
}

/// Counts a scheduler out when its task ends (aborted with its worker).
struct Running(Keiro);

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .scheduler_state()
            .running
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one [`pass`] did.
enum Pass {
    /// Fired every due tick; the earliest next one.
    Done(Option<i64>),
    /// Fired nothing: ticks fall due by this process's clock, which is off
    /// the database server's (see `runtime::clock_check`), so they would
    /// start early or late. They are left to workers whose clocks agree, or
    /// to this one once its clock is back (its cursors stay where they are,
    /// so ticks that fell meanwhile are caught up as a held-up scheduler's
    /// are; a first pass, which writes the linked schedules, stays the
    /// first).
    ClockOff,
}

/// One pass: fires every due tick, returns the earliest next one. `first`:
/// the scheduler's first pass, which runs the ticks missed while no worker
/// ran per `missed`; every pass treats the ticks more than [`LATE_AFTER`]
/// late the same way.
async fn pass(
    keiro: &Keiro,
    runs: &TickRuns,
    cursors: &mut HashMap<String, Cursor>,
    notices: &mut Notices,
    missed: MissedTicks,
    first: bool,
) -> Result<Pass> {
    // Judged before anything is written: a redefined schedule's latest
    // tick comes from this clock too.
    if keiro.clock_is_off() {
        return Ok(Pass::ClockOff);
    }
    if first {
        super::manage::write_linked(keiro).await?;
    }
    // A row that does not read is skipped (and logged once): the others
    // still run.
    let mut rows = Vec::new();
    for row in keiro.raw_store().schedules_each().await? {
        match row {
            Ok(row) => rows.push(row),
            Err(error) => notices.saw(error.to_string()),
        }
    }
    // A schedule this binary skips (see below) keeps no cursor either: when
    // it is its to run again, it starts from its last write, not from how
    // far it was handled before.
    cursors.retain(|name, _| {
        rows.iter()
            .any(|row| row.name == *name && runs_here(keiro, row))
    });
    let now = keiro.now_us();
    // Judged again after `now` is read: a step of the clock before it
    // counts.
    if keiro.clock_is_off() {
        return Ok(Pass::ClockOff);
    }
    let mut next: Option<i64> = None;
    for row in &rows {
        if !runs_here(keiro, row) {
            if keiro.registry().get(&row.workflow).is_none() {
                notices.runs_elsewhere(row);
            }
            continue;
        }
        let Some(cursor) = cursor(cursors, row, now, first, notices) else {
            continue;
        };
        if row.paused {
            // Ticks that fall while paused are not run on resume, nor is a
            // missed one not yet started.
            cursor.handled = now;
            cursor.missed = None;
            cursor.seen = row.updated_at;
            continue;
        }
        if cursor.seen != row.updated_at {
            // Written since the last pass: a resume records the latest tick
            // that fell while paused as the last one (perhaps after that
            // pass, or with the pause unseen between two passes), and a
            // redefinition its latest tick until then; neither is run.
            if let Some(last) = row.last_tick {
                cursor.handled = cursor.handled.max(last);
            }
            cursor.seen = row.updated_at;
        }
        if first && missed == MissedTicks::RunLatest {
            // A schedule that never ticked counts from its last write (its
            // making): a tick that fell since, while no worker ran, is
            // missed like any other.
            let last = row.last_tick.unwrap_or(row.updated_at);
            if let Some(latest) = cursor.spec.latest_until(now) {
                if latest > last {
                    cursor.missed = Some(latest);
                }
            }
        }
        let late = now.saturating_sub(crate::time::duration_us(LATE_AFTER));
        let held_up = cursor.handled < late;
        // The missed tick is not run once a later missed tick supersedes it
        // (its start was refused past `LATE_AFTER`), nor once the schedule's
        // last tick reached it (a resume recorded it as passed over, or
        // another worker ran it or a later one).
        let superseded = held_up
            && missed == MissedTicks::RunLatest
            && cursor
                .spec
                .latest_until(late)
                .is_some_and(|tick| tick > cursor.handled);
        let reached = |tick: i64| row.last_tick.is_some_and(|last| last >= tick);
        if superseded || cursor.missed.is_some_and(reached) {
            cursor.missed = None;
        }
        let mut retry = false;
        if let Some(tick) = cursor.missed {
            retry = fire_logged(keiro, runs, row, tick).await == Fired::Retry;
            if !retry {
                cursor.missed = None;
            }
        }
        if !retry && held_up {
            // Held up: the ticks up to `late` are missed ticks.
            let latest = cursor
                .spec
                .latest_until(late)
                .filter(|&tick| tick > cursor.handled && !reached(tick));
            if let (Some(tick), MissedTicks::RunLatest) = (latest, missed) {
                retry = fire_logged(keiro, runs, row, tick).await == Fired::Retry;
            }
            if !retry {
                cursor.handled = late;
            }
        }
        let due = match retry {
            true => Vec::new(),
            false => cursor
                .spec
                .ticks_within(cursor.handled.saturating_add(1), now, MAX_CATCH_UP),
        };
        for &tick in &due {
            if fire_logged(keiro, runs, row, tick).await == Fired::Retry {
                // Not past this tick: the next pass tries it again.
                retry = true;
                break;
            }
            cursor.handled = tick;
        }
        if !retry && due.len() == MAX_CATCH_UP {
            cursor.handled = now;
        }
        let at = if retry {
            Some(now.saturating_add(crate::time::duration_us(SCHEDULE_POLL)))
        } else {
            cursor.spec.next_after(cursor.handled)
        };
        if let Some(at) = at {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    }
    notices.pass_done();
    Ok(Pass::Done(next))
}

/// Whether this binary runs schedule `row`: not when it does not link its
/// workflow (another binary's to run), nor when it links a
/// `#[workflow(cron)]` schedule's workflow without the attribute (another
/// version's; the version started last decides whether the schedule exists,
/// see `write_linked`).
fn runs_here(keiro: &Keiro, row: &ScheduleRow) -> bool {
    keiro.registry().get(&row.workflow).is_some()
        && (row.input.is_some() || super::manage::declared(&row.name))
}

/// What a scheduler reports of the schedules it skips, each once while it
/// stays so (not at every pass, twice a second), and again if it comes
/// back after it was mended or deleted.
#[derive(Default)]
struct Notices {
    /// The schedules it could not read, by error.
    unreadable: Recurring,
    /// The schedules whose workflow this binary does not link, by name.
    elsewhere: Recurring,
}

/// Keys met in the last finished pass and in this one, so that a key met
/// pass after pass counts as new only in the first.
#[derive(Default)]
struct Recurring {
    last_pass: std::collections::HashSet<String>,
    this_pass: std::collections::HashSet<String>,
}

impl Recurring {
    /// Notes `key` in this pass; whether neither this pass nor the last met
    /// it before.
    fn is_new(&mut self, key: &str) -> bool {
        let new = !self.last_pass.contains(key) && !self.this_pass.contains(key);
        self.this_pass.insert(key.to_owned());
        new
    }

    fn pass_done(&mut self) {
        self.last_pass = std::mem::take(&mut self.this_pass);
    }
}

impl Notices {
    /// This pass could not read a schedule, as `error` says.
    fn saw(&mut self, error: String) {
        if self.unreadable.is_new(&error) {
            tracing::error!(
                %error,
                "keiro's cron scheduler skips a schedule it cannot read (the others run); fix \
                 the row, or delete it with `delete_schedule`"
            );
        }
    }

    /// This pass skipped schedule `row`, whose workflow this binary does
    /// not link: a worker of a binary that does runs it. Nothing says
    /// whether one exists, so it is noted once, for the operator who
    /// renamed the workflow or made the schedule where no worker serves it.
    fn runs_elsewhere(&mut self, row: &ScheduleRow) {
        if self.elsewhere.is_new(&row.name) {
            tracing::info!(
                schedule = %row.name,
                workflow = %row.workflow,
                "keiro's cron scheduler leaves schedule `{}` to workers whose binary links \
                 workflow `{}` (this one does not); if none does, its ticks run nowhere",
                row.name,
                row.workflow
            );
        }
    }

    fn pass_done(&mut self) {
        self.unreadable.pass_done();
        self.elsewhere.pass_done();
    }
}

/// The cursor of `row`, made or re-parsed when its definition changed;
/// `None` when the stored definition does not parse. A new one starts at
/// `now` on the scheduler's `first` pass (missed ticks are start-up's), and
/// on a later one at the row's last write: a schedule made by another
/// process just before a tick still runs it, and one this scheduler first
/// reads more than [`LATE_AFTER`] after its making (it was held up) treats
/// the ticks since as missed ticks.
fn cursor<'c>(
    cursors: &'c mut HashMap<String, Cursor>,
    row: &ScheduleRow,
    now: i64,
    first: bool,
    notices: &mut Notices,
) -> Option<&'c mut Cursor> {
    let definition = (row.cron.clone(), row.timezone.clone());
    if let Some(existing) = cursors.get(&row.name) {
        if existing.definition == definition {
            return cursors.get_mut(&row.name);
        }
    }
    let spec = match CronSpec::parse(&row.name, &row.cron, &row.timezone) {
        Ok(spec) => spec,
        Err(error) => {
            notices.saw(error.to_string());
            return None;
        }
    };
    // A redefined schedule keeps how far it was handled, not a missed tick
    // of its old definition, and runs no tick of its new one that fell
    // before the change: a schedule deleted and made again between two
    // passes, with no tick recorded as passed over, starts at its making
    // like a new one.
    // (A change seen more than `LATE_AFTER` after it was written leaves
    // the ticks since then to the held-up handling, as missed ticks.)
    let written = row.updated_at.saturating_sub(1).min(now);
    // Never before the last tick the row records (one passed over by a
    // resume or a redefinition, which may predate `written` when the
    // writer's clock was behind).
    let handled = match cursors.get(&row.name) {
        Some(cursor) => cursor.handled.max(written),
        None if first => now,
        None => written.max(row.last_tick.unwrap_or(i64::MIN)),
    };
    let seen = cursors.get(&row.name).map_or(row.updated_at, |c| c.seen);
    cursors.insert(
        row.name.clone(),
        Cursor {
            definition,
            spec,
            handled,
            missed: None,
            seen,
        },
    );
    cursors.get_mut(&row.name)
}

/// What became of one tick's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fired {
    /// Past it: its instance exists (made now, or by another worker
    /// before), or it can never start (its id or arguments are refused;
    /// logged).
    Passed,
    /// The store could not be reached or was busy: try the tick again.
    Retry,
}

async fn fire_logged(keiro: &Keiro, runs: &TickRuns, row: &ScheduleRow, tick: i64) -> Fired {
    // In one of the worker's slots, else left for a pass to claim.
    let start = match runs.slot() {
        Some(slot) => Start::Here(runs, slot),
        None => Start::Pending,
    };
    match fire(keiro, row, tick, start).await {
        Ok(_) => Fired::Passed,
        Err(error) if error.is_transient() => {
            tracing::warn!(
                %error,
                schedule = %row.name,
                tick = %super::spec::rfc3339(tick),
                "keiro could not start a cron tick; trying it again"
            );
            Fired::Retry
        }
        Err(error) => {
            tracing::error!(
                %error,
                schedule = %row.name,
                tick = %super::spec::rfc3339(tick),
                "keiro cannot start a cron tick; it is passed over"
            );
            Fired::Passed
        }
    }
}
