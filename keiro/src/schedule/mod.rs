//! Cron schedules: `#[workflow(cron = "..", timezone = "..")]` and dynamic
//! schedules made at run time, each tick run exactly once across all workers.
//!
//! * `spec.rs`: a cron expression in its time zone, and tick arithmetic.
//! * `registration.rs`: the link-time registry of `#[workflow(cron)]`.
//! * `fire.rs`: creating one tick's instance under its derived id.
//! * `scheduler.rs`: the loop each resume worker runs beside its claims.
//! * `tick_runs.rs`: the runs a scheduler starts itself, one per tick it
//!   created.
//! * `manage.rs`: list, pause, resume, trigger, backfill, create, delete.
//! * `info.rs`: [`ScheduleInfo`] and the [`MissedTicks`] setting.
//!
//! Each tick's instance id is `cron:<schedule>:<tick in RFC 3339, UTC>`:
//! every worker running the scheduler creates it, and the id's uniqueness
//! makes that one instance. The scheduler that created it holds its lease
//! from the start and drives it at once in its own process; an instance of
//! a trigger or a backfill is pending for whichever resume worker claims it.

mod fire;
mod info;
mod manage;
mod registration;
pub(crate) mod scheduler;
mod spec;
pub(crate) mod tick_runs;

pub use info::{MissedTicks, ScheduleInfo};
pub use manage::MAX_BACKFILL_TICKS;
pub use registration::CronRegistration;
pub use spec::DEFAULT_TIMEZONE;
