//! The link-time registry of `#[workflow(cron = "..")]` schedules: the macro
//! submits one [`CronRegistration`] beside the workflow's own registration.

/// One `#[workflow(cron = "..", timezone = "..")]`: the workflow (which is
/// also the schedule's name), its expression and time zone, both checked by
/// the macro.
#[derive(Debug)]
pub struct CronRegistration {
    pub(crate) workflow: &'static str,
    pub(crate) cron: &'static str,
    pub(crate) timezone: &'static str,
}

impl CronRegistration {
    /// Used by `#[workflow(cron = "..")]`.
    pub const fn new(
        workflow: &'static str,
        cron: &'static str,
        timezone: &'static str,
    ) -> CronRegistration {
        CronRegistration {
            workflow,
            cron,
            timezone,
        }
    }
}

inventory::collect!(CronRegistration);

/// Every `#[workflow(cron)]` schedule linked into this binary.
pub(crate) fn linked() -> impl Iterator<Item = &'static CronRegistration> {
    inventory::iter::<CronRegistration>.into_iter()
}
