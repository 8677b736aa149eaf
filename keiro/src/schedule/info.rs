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
    /// The next tick after now by the store's clock; `None` while paused or
    /// when the expression has no further tick.
    pub next_tick: Option<SystemTime>,
    /// The latest tick a worker started an instance for (or a trigger
    /// ran at), if any; after a resume, at least the latest tick that fell
    /// while paused, which was passed over.
    pub last_tick: Option<SystemTime>,
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
    /// ticked before has nothing missed.
    #[default]
    RunLatest,
    /// Run none: the first tick after start-up (or after the hold-up) is
    /// the next one due.
    Skip,
}
