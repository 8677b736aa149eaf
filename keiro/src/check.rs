//! The pre-deploy check: [`Keiro::check`] replays every unfinished instance
//! against the code of the binary calling it and lists those the code would
//! diverge from, before anything is rolled out.

use keiro_store::InstanceStatus;

use crate::history::replay::Replayer;
use crate::history::{Divergence, ReplayError};
use crate::{Keiro, ListFilter, Result, WorkflowStatus};

/// Instances per page of the listing the check walks: the most it holds in
/// memory at once, and how many replays share one private runtime.
const PAGE: u32 = 200;

/// What [`Keiro::check`] found. [`is_ok`](CheckReport::is_ok) when no
/// checked instance would diverge or fail; its `Display` is a short report
/// for a deploy log.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CheckReport {
    /// How many unfinished instances of workflows this binary registers
    /// were replayed.
    pub checked: u64,
    /// Those whose journal the current code diverges from: they would be
    /// set aside as non-deterministic once this code resumes them.
    pub diverging: Vec<Divergence>,
    /// Those whose replay failed otherwise: their input or a recorded
    /// result no longer decodes into the current types, or the code
    /// panicked replaying them.
    pub failed: Vec<ReplayError>,
    /// Unfinished instances of workflows this binary does not register:
    /// not checked (another binary's, or workflows removed or renamed).
    pub unregistered: Vec<Unregistered>,
}

/// An unfinished instance of a workflow the checking binary does not
/// register.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unregistered {
    /// The instance id.
    pub id: String,
    /// Its workflow name.
    pub workflow: String,
}

impl CheckReport {
    /// Whether every checked instance replays without divergence or failure
    /// (instances of unregistered workflows are not counted against it).
    pub fn is_ok(&self) -> bool {
        self.diverging.is_empty() && self.failed.is_empty()
    }
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "keiro check: {} unfinished instance(s) replayed, {} diverge, {} fail, {} of \
             workflows this binary does not register",
            self.checked,
            self.diverging.len(),
            self.failed.len(),
            self.unregistered.len()
        )?;
        for divergence in &self.diverging {
            writeln!(f, "  diverges: {divergence}")?;
        }
        for failure in &self.failed {
            writeln!(f, "  fails: {failure}")?;
        }
        for other in &self.unregistered {
            writeln!(
                f,
                "  not checked: {} (workflow `{}` is not in this binary)",
                other.id, other.workflow
            )?;
        }
        Ok(())
    }
}

impl Keiro {
    /// The pre-deploy check, called from the new binary before it is rolled
    /// out: replays every unfinished instance (pending, running or
    /// suspended; not those set aside already) of a workflow this binary
    /// registers against this binary's code, with no side effects (see
    /// [`crate::testing::replay`]), and lists those that would diverge or
    /// fail; instances of workflows it does not register are listed
    /// separately, unchecked.
    ///
    /// Walks the instances page by page (oldest first), so memory stays
    /// bounded whatever their number; only what it reports is kept.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
    /// let report = keiro.check().await?;
    /// print!("{report}");
    /// if !report.is_ok() {
    ///     std::process::exit(1); // do not roll this binary out
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check(&self) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let mut filter = ListFilter::default()
            .status(WorkflowStatus::Pending)
            .status(WorkflowStatus::Running)
            .status(WorkflowStatus::Suspended)
            .oldest_first()
            .limit(PAGE);
        loop {
            let page = self.list(&filter).await?;
            // A fresh private runtime per page keeps its store small.
            let replayer = Replayer::new().await?;
            for summary in &page.items {
                let Some(registration) = self.registry().get(&summary.name) else {
                    report.unregistered.push(Unregistered {
                        id: summary.id.clone(),
                        workflow: summary.name.clone(),
                    });
                    continue;
                };
                let history = match self.export(&summary.id).await {
                    Ok(history) => history,
                    // Deleted since it was listed: nothing left to check.
                    Err(crate::Error::NotFound { .. }) => continue,
                    Err(error) => return Err(error),
                };
                let unfinished =
                    InstanceStatus::parse(&history.status).is_some_and(|status| !status.is_final());
                if !unfinished {
                    // It ended since it was listed.
                    continue;
                }
                report.checked += 1;
                match replayer
                    .replay(&history, registration.name, registration.run)
                    .await
                {
                    Ok(_) => {}
                    Err(ReplayError::Diverged(divergence)) => report.diverging.push(divergence),
                    Err(error) => report.failed.push(error),
                }
            }
            replayer.close().await;
            match page.next_cursor {
                Some(cursor) => filter = filter.cursor(cursor),
                None => return Ok(report),
            }
        }
    }
}

/// [`Keiro::check`] on the process-wide runtime: what a deploy step calls
/// from the new binary.
pub async fn check() -> Result<CheckReport> {
    crate::runtime::global().await?.check().await
}
