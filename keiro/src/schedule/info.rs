//! What the management calls report and the scheduler's start-up setting.

use std::time::SystemTime;

/// One schedule, as [`Keiro::schedules`](crate::Keiro::schedules) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The schedule's name: the workflow's for `#[workflow(cron = "..")]`,
    /// the one given to [`Keiro::create_schedule`](crate::Keiro::create_schedule)
    /// for a dynamic one.
    pub name: String,
    /// The workflow each tick starts.
    pub workflow: String,
    /// The cron expression, seconds field first.
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub timezone: String,
    /// Whether ticks are paused ([`Keiro::pause_schedule`](crate::Keiro::pause_schedule)).
    pub paused: bool,
    /// Whether it was made at run time (and can be deleted) rather than
    /// declared by `#[workflow(cron)]`.
    pub dynamic: bool,
    /// The next tick after now by the listing process's clock; `None` while
    /// paused, when the expression has no further tick, or when it does
    /// not parse (see [`ScheduleInfo::problem`]).
    pub next_tick: Option<SystemTime>,
    /// The latest tick an instance was started for (by a worker or a
    /// backfill; a trigger records none), if any; after a resume, at least the
    /// latest tick that fell while paused, and after a redefinition the
    /// latest tick of the old definition, both passed over.
    pub last_tick: Option<SystemTime>,
    /// Why no worker runs this schedule, when its stored definition is
    /// broken: the expression or time zone does not parse (a row written
    /// by hand, or by a newer version). `None` for a sound schedule.
    pub problem: Option<String>,
}

/// What a scheduler does with missed ticks (set with
/// [`ResumeOptions::missed_ticks`](crate::ResumeOptions::missed_ticks)): at
/// start-up, the ticks that fell while no worker ran; while running, the
/// ticks more than a minute late (the scheduler was held up: a suspended
/// machine, a store out of reach or refusing the tick's start for longer).
/// Ticks less late are all run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissedTicks {
    /// Run the latest missed tick once, with its own tick time (the
    /// default): a nightly job whose workers were down at 02:00 runs once
    /// when one starts, not once per missed night. A schedule that never
    /// ticked counts from when it was made (or last changed): a first tick
    /// that fell while no worker ran is missed like any other.
    #[default]
    RunLatest,
    /// Run none: the first tick after start-up (or after the hold-up) is
    /// the next one due.
    Skip,
}
