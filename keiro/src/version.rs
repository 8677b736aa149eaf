//! Application versions: which code an instance was started under, and
//! which instances a worker may run.
//!
//! Every instance records the version of the process that created it (a
//! child, an enqueue and a continue-as-new record the creating process's; a
//! retry keeps the instance's; a fork copies its source's). A resume worker
//! claims only instances of its own version, of a version it declares
//! compatible ([`KeiroBuilder::compatible_versions`]), or with no version:
//! rows created before versions were recorded are *unversioned*, and every
//! worker claims them. Instances of other versions are never dropped: each
//! pass counts them ([`ResumeSummary::other_version`]) and logs each such
//! version once, [`Keiro::version_counts`] shows which versions hold
//! unfinished work, and [`Keiro::retarget`] moves them.
//!
//! [`KeiroBuilder::compatible_versions`]: crate::KeiroBuilder::compatible_versions
//! [`ResumeSummary::other_version`]: crate::ResumeSummary::other_version

use crate::registry::Registry;
use crate::{Error, Keiro, Result};

pub use keiro_store::VersionCount;

/// The environment variable naming this process's application version when
/// [`KeiroBuilder::app_version`](crate::KeiroBuilder::app_version) does not.
pub const APP_VERSION_ENV: &str = "KEIRO_APP_VERSION";

/// The longest application version accepted, in bytes.
pub const MAX_APP_VERSION_BYTES: usize = 128;

/// How many hex digits the default version (a hash) has.
const DEFAULT_VERSION_DIGITS: usize = 16;

/// Refuses a version that is empty, longer than [`MAX_APP_VERSION_BYTES`],
/// or holds whitespace or control characters, with
/// [`Error::InvalidAppVersion`] naming it and where it came from.
pub(crate) fn validate(version: &str, source: &'static str) -> Result<()> {
    let reason = if version.is_empty() {
        "it is empty"
    } else if version.len() > MAX_APP_VERSION_BYTES {
        "it is longer than 128 bytes"
    } else if version.chars().any(|c| c.is_whitespace() || c.is_control()) {
        "it holds whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidAppVersion {
        version: keiro_store::preview_id(version),
        source_name: source,
        reason,
    })
}

/// The default application version: a hash of every linked workflow's name
/// and body hash (emitted by `#[workflow]`), sorted by name. It changes
/// whenever a workflow's code changes, is added or removed.
pub(crate) fn default_version(registry: &Registry) -> String {
    default_version_of(registry.body_hashes())
}

/// [`default_version`] of these workflow names and body hashes.
pub(crate) fn default_version_of<'a>(
    workflows: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut workflows: Vec<_> = workflows.into_iter().collect();
    workflows.sort_unstable();
    let mut text = String::new();
    for (name, body_hash) in workflows {
        text.push_str(name);
        text.push('=');
        text.push_str(body_hash);
        text.push('\n');
    }
    let mut hash = fnv1a_hex(text.as_bytes());
    hash.truncate(DEFAULT_VERSION_DIGITS);
    hash
}

/// 64-bit FNV-1a as 16 hex digits (the macros hash bodies the same way).
fn fnv1a_hex(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// This runtime's version and the ones it declares compatible.
#[derive(Debug, Clone)]
pub(crate) struct AppVersions {
    /// Recorded with every instance this runtime creates.
    own: String,
    /// Its own version first, then the compatible ones, deduplicated: what
    /// its resume worker claims.
    accepted: Vec<String>,
}

impl AppVersions {
    /// `own` (the builder's, else [`APP_VERSION_ENV`], else the default) and
    /// `compatible`, each validated.
    pub(crate) fn new(
        configured: Option<String>,
        compatible: Vec<String>,
        registry: &Registry,
    ) -> Result<AppVersions> {
        let own = match configured {
            Some(version) => {
                validate(&version, "KeiroBuilder::app_version")?;
                version
            }
            None => match std::env::var(APP_VERSION_ENV) {
                Ok(version) => {
                    validate(&version, APP_VERSION_ENV)?;
                    version
                }
                Err(_) => default_version(registry),
            },
        };
        let mut accepted = vec![own.clone()];
        for version in compatible {
            validate(&version, "KeiroBuilder::compatible_versions")?;
            if !accepted.contains(&version) {
                accepted.push(version);
            }
        }
        Ok(AppVersions { own, accepted })
    }

    /// This runtime's version.
    pub(crate) fn own(&self) -> &str {
        &self.own
    }

    /// The versions its resume worker claims (its own first).
    pub(crate) fn accepted(&self) -> Vec<&str> {
        self.accepted.iter().map(String::as_str).collect()
    }

    /// The versions it declares compatible besides its own.
    pub(crate) fn compatible(&self) -> &[String] {
        &self.accepted[1..]
    }
}

impl Keiro {
    /// The application version this runtime records with every instance it
    /// creates, and whose instances its resume worker claims: the
    /// builder's [`app_version`](crate::KeiroBuilder::app_version), else
    /// [`APP_VERSION_ENV`], else a hash of every linked workflow's body (so
    /// by default any change to a workflow's code is a new version).
    pub fn app_version(&self) -> &str {
        self.versions().own()
    }

    /// The versions besides its own whose instances this runtime's resume
    /// worker claims ([`crate::KeiroBuilder::compatible_versions`]).
    pub fn compatible_versions(&self) -> &[String] {
        self.versions().compatible()
    }

    /// Every application version holding unfinished instances, with how
    /// many it holds and how many are due now (a worker of that version
    /// would claim them): how an operator sees work no running worker
    /// takes. Unversioned instances are listed with version `None`.
    pub async fn version_counts(&self) -> Result<Vec<VersionCount>> {
        Ok(self.raw_store().version_counts().await?)
    }

    /// Moves every unfinished instance of version `from` (pending, running,
    /// suspended, or set aside for non-determinism) to version `to`, so
    /// workers of `to` run them; finished instances keep their version.
    /// Returns how many moved. Both versions are validated like
    /// [`crate::KeiroBuilder::app_version`].
    ///
    /// Only sound when the code of `to` replays those instances' journals:
    /// check first with `keiro check --binary-hashes` (see
    /// [`crate::binary_hashes`]).
    pub async fn retarget(&self, from: &str, to: &str) -> Result<u64> {
        validate(from, "retarget --from")?;
        validate(to, "retarget --to")?;
        let moved = self.raw_store().retarget(from, to).await?;
        if moved > 0 {
            // The moved instances may be due: wake this process's worker and,
            // on PostgreSQL, the others (they poll otherwise).
            self.wake_all_workers("a retarget").await;
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_must_be_short_printable_and_non_empty() {
        assert!(validate("v1.2.3+build.7", "test").is_ok());
        for bad in ["", "has space", "tab\t", "nul\0", &"x".repeat(129)] {
            let err = validate(bad, "KEIRO_APP_VERSION").unwrap_err();
            let text = err.to_string();
            assert!(text.contains("KEIRO_APP_VERSION"), "{text}");
            assert!(matches!(err, Error::InvalidAppVersion { .. }), "{err:?}");
        }
    }

    #[test]
    fn the_default_version_is_a_short_hash_of_the_registry() {
        let version = default_version(&Registry::default());
        assert_eq!(version.len(), DEFAULT_VERSION_DIGITS);
        assert!(version.chars().all(|c| c.is_ascii_hexdigit()), "{version}");
        assert_eq!(version, default_version(&Registry::default()));
    }

    #[test]
    fn compatible_versions_are_accepted_after_the_own_one() {
        let versions = AppVersions::new(
            Some("v2".into()),
            vec!["v1".into(), "v2".into(), "v1".into()],
            &Registry::default(),
        )
        .unwrap();
        assert_eq!(versions.own(), "v2");
        assert_eq!(versions.accepted(), ["v2", "v1"]);
        assert_eq!(versions.compatible(), ["v1".to_owned()]);
    }
}
