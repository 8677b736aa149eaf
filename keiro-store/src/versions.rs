//! Application versions: which versions hold unfinished (and due) work, and
//! moving unfinished instances from one version to another.
//!
//! Each instance records the version of the process that created it
//! ([`crate::NewInstance::app_version`]); the resume worker's claim takes
//! only its accepted versions (see [`Store::claim_due`]). Rows from before
//! migration 0014 have none: they are unversioned and every worker claims
//! them.

use crate::rows::{FromRow, StoreRow};
use crate::sql::Dialect;
use crate::{Result, Store};

/// The statements of this module.
#[derive(Debug)]
pub(crate) struct VersionStatements {
    /// Per version: unfinished instances, and how many of them are due.
    version_counts: String,
    /// Moves the unfinished (or set-aside) instances of one version.
    retarget: String,
}

impl VersionStatements {
    pub(crate) fn new(d: &Dialect) -> VersionStatements {
        let w = format!("{}workflows", d.tables);
        VersionStatements {
            version_counts: format!(
                "SELECT app_version, COUNT(*) AS unfinished, \
                 COUNT(CASE WHEN wake_at <= $1 THEN 1 END) AS due \
                 FROM {w} WHERE status IN ('pending', 'running', 'suspended') \
                 GROUP BY app_version ORDER BY app_version"
            ),
            retarget: format!(
                "UPDATE {w} SET app_version = $2, updated_at = $3 WHERE app_version = $1 \
                 AND status IN ('pending', 'running', 'suspended', 'nondeterministic')"
            ),
        }
    }
}

/// How much unfinished work one application version holds
/// ([`Store::version_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionCount {
    /// The version; `None` for unversioned instances (created before
    /// versions were recorded), which every worker claims.
    pub version: Option<String>,
    /// Its unfinished instances (pending, running or suspended).
    pub unfinished: u64,
    /// Those of them due now: a worker of this version would claim them.
    pub due: u64,
}

impl FromRow for VersionCount {
    fn from_row(row: &impl StoreRow) -> Result<Self> {
        let version = row.maybe_text(|| "a version count".into(), "app_version")?;
        let what = || format!("the count of version {version:?}");
        let count = |column| row.int(what, column).map(|n| n.max(0) as u64);
        Ok(VersionCount {
            unfinished: count("unfinished")?,
            due: count("due")?,
            version,
        })
    }
}

/// The accepted versions as the claim binds them: a JSON array of text.
pub(crate) fn versions_json(versions: &[&str]) -> String {
    serde_json::Value::from(versions).to_string()
}

impl Store {
    /// Every application version holding unfinished instances, with how many
    /// it holds and how many are due now, ordered by version (unversioned
    /// first).
    pub async fn version_counts(&self) -> Result<Vec<VersionCount>> {
        let args = args![self.now_us()];
        self.fetch_all(
            "version_counts",
            |sql| &sql.versions.version_counts,
            &args,
            None,
        )
        .await
    }

    /// Moves every unfinished instance of version `from` (pending, running,
    /// suspended, or set aside for non-determinism) to version `to`, so
    /// workers of `to` claim it. Finished instances keep their version.
    /// Returns how many moved.
    pub async fn retarget(&self, from: &str, to: &str) -> Result<u64> {
        let args = args![from, to, self.now_us()];
        self.execute("retarget", |sql| &sql.versions.retarget, &args)
            .await
    }
}
