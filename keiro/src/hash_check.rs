//! The pre-deploy check: which unfinished instances a new binary's code
//! could replay differently from how they ran.
//!
//! `#[workflow]` hashes each body's step-call skeleton (the awaited calls in
//! order and the `if`/`match`/loop structure around them; plain
//! expressions play no part) and every instance records its workflow's hash
//! when it is created. The new binary writes its hashes ([`binary_hashes`]);
//! the deploy step compares them with the database before rolling out
//! (`keiro check --binary-hashes FILE`, or [`Keiro::check_hashes`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::registry::WorkflowRegistration;
use crate::{Keiro, ListFilter, Result, WorkflowStatus, WorkflowSummary, MAX_PAGE};

/// What a binary's workflows look like to the pre-deploy check: its
/// application version and each linked workflow's skeleton hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinaryHashes {
    /// The version this binary records and claims (see
    /// [`Keiro::app_version`]): [`crate::APP_VERSION_ENV`] when set to a
    /// valid version, else the hash of its workflows' bodies. (A version set
    /// only through [`crate::KeiroBuilder::app_version`] is not seen here:
    /// set this field before writing the file.)
    pub app_version: String,
    /// Every linked workflow's step-call skeleton hash, by name.
    pub workflows: BTreeMap<String, String>,
}

/// The hashes of the workflows linked into this binary: the input of the
/// pre-deploy check. `#[workflow]` hashes each body's step-call skeleton
/// (the awaited calls in order and the `if`/`match`/loop structure around
/// them; plain expressions play no part), and every instance records its
/// workflow's hash when it is created. A deploy step has the new binary
/// write its hashes, then asks `keiro check` (or [`Keiro::check_hashes`]) which
/// unfinished instances that code could replay differently, before
/// rolling it out:
///
/// ```no_run
/// // In the new binary's main, before anything else:
/// if std::env::args().any(|a| a == "--print-hashes") {
///     println!("{}", keiro::binary_hashes().to_json());
///     return;
/// }
/// ```
/// ```text
/// $ ./new-build --print-hashes > hashes.json
/// $ keiro check --binary-hashes hashes.json || exit 1   # lists what would diverge
/// ```
///
/// The skeleton is syntactic: an awaited call inside a helper function is
/// not part of it, so an empty check is strong evidence, not proof.
pub fn binary_hashes() -> BinaryHashes {
    let registrations: Vec<&WorkflowRegistration> = inventory::iter::<WorkflowRegistration>
        .into_iter()
        .collect();
    let workflows = registrations
        .iter()
        .map(|r| (r.name.to_owned(), r.skeleton_hash.to_owned()))
        .collect();
    let env = std::env::var(crate::APP_VERSION_ENV)
        .ok()
        .filter(|v| crate::version::validate(v, crate::APP_VERSION_ENV).is_ok());
    let app_version = env.unwrap_or_else(|| {
        crate::version::default_version_of(registrations.iter().map(|r| (r.name, r.body_hash)))
    });
    BinaryHashes {
        app_version,
        workflows,
    }
}

impl BinaryHashes {
    /// The hashes as pretty-printed JSON, the file `keiro check` reads.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a map of strings always encodes")
    }

    /// Reads hashes written by [`BinaryHashes::to_json`].
    pub fn from_json(text: &str) -> std::result::Result<BinaryHashes, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// An unfinished instance the new binary's code could replay differently.
#[derive(Debug, Clone)]
pub struct HashMismatch {
    /// The instance.
    pub summary: WorkflowSummary,
    /// Why it is listed.
    pub reason: HashMismatchReason,
}

/// Why [`Keiro::check_hashes`] lists an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashMismatchReason {
    /// Its workflow's skeleton changed: the recorded hash is not the new one.
    SkeletonChanged {
        /// The hash recorded with the instance.
        recorded: String,
        /// The new binary's hash of its workflow.
        new: String,
    },
    /// The new binary does not link its workflow at all.
    WorkflowMissing,
}

/// What [`Keiro::check_hashes`] found.
#[derive(Debug, Clone, Default)]
pub struct HashCheckReport {
    /// The unfinished instances the new code could diverge from, oldest
    /// first.
    pub diverging: Vec<HashMismatch>,
    /// Unfinished instances looked at.
    pub checked: u64,
    /// Those of them with no recorded skeleton hash (created before keiro
    /// recorded it), which the check cannot judge.
    pub unrecorded: u64,
}

impl Keiro {
    /// The pre-deploy check: every unfinished instance (pending, running or
    /// suspended) whose recorded skeleton hash differs from `new`'s hash of
    /// its workflow, or whose workflow `new` does not link. An empty
    /// [`HashCheckReport::diverging`] means the new code keeps the step-call
    /// skeleton of everything in flight (a syntactic check: see
    /// [`binary_hashes`]).
    pub async fn check_hashes(&self, new: &BinaryHashes) -> Result<HashCheckReport> {
        let mut report = HashCheckReport::default();
        let mut filter = ListFilter::default()
            .status(WorkflowStatus::Pending)
            .status(WorkflowStatus::Running)
            .status(WorkflowStatus::Suspended)
            .oldest_first()
            .limit(MAX_PAGE);
        loop {
            let page = self.list(&filter).await?;
            for summary in page.items {
                report.checked += 1;
                let reason = match (new.workflows.get(&summary.name), &summary.skeleton_hash) {
                    (None, _) => Some(HashMismatchReason::WorkflowMissing),
                    (Some(_), None) => {
                        report.unrecorded += 1;
                        None
                    }
                    (Some(new), Some(recorded)) if new != recorded => {
                        Some(HashMismatchReason::SkeletonChanged {
                            recorded: recorded.clone(),
                            new: new.clone(),
                        })
                    }
                    _ => None,
                };
                if let Some(reason) = reason {
                    report.diverging.push(HashMismatch { summary, reason });
                }
            }
            match page.next_cursor {
                Some(cursor) => filter = filter.cursor(cursor),
                None => return Ok(report),
            }
        }
    }
}
