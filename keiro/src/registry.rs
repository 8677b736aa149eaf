//! The link-time registry of workflows: every `#[workflow]` submits one
//! [`WorkflowRegistration`] through `inventory`, and a runtime collects them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use keiro_store::Registered;

use crate::{Error, Result};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Rebuilds a workflow call from its stored input and runs its body.
pub type RunFn = fn(WorkflowInput) -> BoxFuture<'static, Result<WorkflowOutput>>;

/// Computes a workflow's signature (see `crate::signature`).
pub type SignatureFn = fn() -> String;

/// One registered workflow: its name, the function that registered it, how
/// to run it from stored input and its signature.
#[derive(Debug)]
pub struct WorkflowRegistration {
    pub(crate) name: &'static str,
    pub(crate) fn_path: &'static str,
    pub(crate) run: RunFn,
    pub(crate) signature: SignatureFn,
    /// The hash of the body's tokens (see [`WorkflowRegistration::with_body_hash`]).
    pub(crate) body_hash: &'static str,
    /// The hash of the body's step-call skeleton (see
    /// [`WorkflowRegistration::with_skeleton_hash`]); empty when not emitted.
    pub(crate) skeleton_hash: &'static str,
    /// `#[workflow(journal = "..")]`; `None`: the runtime's default.
    pub(crate) journal: Option<crate::Journal>,
}

impl WorkflowRegistration {
    /// Used by `#[workflow]`.
    pub const fn new(
        name: &'static str,
        fn_path: &'static str,
        run: RunFn,
        signature: SignatureFn,
    ) -> Self {
        WorkflowRegistration {
            name,
            fn_path,
            run,
            signature,
            body_hash: "",
            skeleton_hash: "",
            journal: None,
        }
    }

    /// Used by `#[workflow(journal = "..")]`: how this workflow journals its
    /// steps, whatever the runtime's default (see [`crate::Journal`]).
    pub const fn with_journal(mut self, journal: crate::Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Used by `#[workflow]`: the hash of the body's step-call skeleton,
    /// recorded with each instance it starts for the pre-deploy check (see
    /// [`crate::binary_hashes`]).
    pub const fn with_skeleton_hash(mut self, hash: &'static str) -> Self {
        self.skeleton_hash = hash;
        self
    }

    /// Used by `#[workflow]`: the hash of the body's tokens, which the
    /// default application version combines (see [`crate::Keiro::app_version`]).
    pub const fn with_body_hash(mut self, hash: &'static str) -> Self {
        self.body_hash = hash;
        self
    }
}

inventory::collect!(WorkflowRegistration);

/// The stored arguments of one workflow instance, handed to its [`RunFn`].
#[derive(Debug, Clone)]
pub struct WorkflowInput {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) json: String,
}

impl WorkflowInput {
    /// Decodes the arguments; a mismatch names the workflow and the id.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.json).map_err(|e| {
            Error::decode(
                format!(
                    "the stored input of workflow `{}` (id {}) into its current argument types",
                    self.name, self.id
                ),
                e,
            )
        })
    }
}

/// A workflow's encoded return value.
#[derive(Debug, Clone)]
pub struct WorkflowOutput {
    pub(crate) json: String,
    pub(crate) is_err: bool,
}

impl WorkflowOutput {
    /// Encodes a return value; `is_err` marks an `Err` result, which makes the
    /// instance `Failed`.
    ///
    /// A value that would not read back (a NaN, nesting too deep) is
    /// [`Error::NotJournalable`], naming the running workflow and id.
    pub fn encode<T: serde::Serialize>(value: &T, is_err: bool) -> Result<WorkflowOutput> {
        let json = crate::json::to_json(value, || match crate::context::current() {
            Some(cx) => format!("workflow `{}` id `{}` returned", cx.name, cx.id),
            None => "a workflow returned".to_owned(),
        })?;
        if let Some(cx) = crate::context::current() {
            crate::json::check_size(
                &json,
                cx.keiro.max_payload_bytes(),
                &cx.name,
                &cx.id,
                || "the return value (output)".to_owned(),
            )?;
        }
        Ok(WorkflowOutput { json, is_err })
    }
}

/// Every workflow linked into this binary, by name, with its signature
/// computed once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    by_name: HashMap<&'static str, (&'static WorkflowRegistration, String)>,
    /// The queues declared with `keiro::queue!`, sorted by name.
    queues: Vec<&'static crate::Queue>,
}

impl Registry {
    /// Collects the `inventory` submissions; two functions claiming one name
    /// are refused with an error naming both.
    pub(crate) fn collect() -> Result<Registry> {
        let registry = Registry::from_iter(inventory::iter::<WorkflowRegistration>)?;
        Ok(Registry {
            queues: crate::queue::collect()?,
            ..registry
        })
    }

    /// The queues linked into this binary, sorted by name.
    pub(crate) fn queues(&self) -> &[&'static crate::Queue] {
        &self.queues
    }

    fn from_iter(
        registrations: impl IntoIterator<Item = &'static WorkflowRegistration>,
    ) -> Result<Registry> {
        let mut by_name = HashMap::new();
        for registration in registrations {
            let signature = (registration.signature)();
            if let Some((previous, _)) =
                by_name.insert(registration.name, (registration, signature))
            {
                let (first, second) = if previous.fn_path <= registration.fn_path {
                    (previous.fn_path, registration.fn_path)
                } else {
                    (registration.fn_path, previous.fn_path)
                };
                return Err(Error::DuplicateWorkflow {
                    name: registration.name.to_owned(),
                    first: first.to_owned(),
                    second: second.to_owned(),
                });
            }
        }
        Ok(Registry {
            by_name,
            queues: Vec::new(),
        })
    }

    /// The registered names, sorted.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.by_name.keys().copied().collect();
        names.sort_unstable();
        names
    }

    /// Every registered name with its body hash, sorted by name.
    pub(crate) fn body_hashes(&self) -> Vec<(&'static str, &'static str)> {
        let mut hashes: Vec<_> = self
            .by_name
            .iter()
            .map(|(name, (registration, _))| (*name, registration.body_hash))
            .collect();
        hashes.sort_unstable();
        hashes
    }

    /// The registered names and signatures, sorted by name.
    pub(crate) fn workflows(&self) -> Vec<Registered<'_>> {
        let mut workflows: Vec<_> = self
            .by_name
            .iter()
            .map(|(name, (_, signature))| Registered { name, signature })
            .collect();
        workflows.sort_unstable_by_key(|w| w.name);
        workflows
    }

    /// The signature of the registered workflow `name`.
    pub(crate) fn signature(&self, name: &str) -> Option<&str> {
        self.by_name
            .get(name)
            .map(|(_, signature)| signature.as_str())
    }

    /// The skeleton hash of the workflow registered under `name`, if it is
    /// registered and its macro emitted one.
    pub(crate) fn skeleton_hash(&self, name: &str) -> Option<&'static str> {
        self.get(name)
            .map(|registration| registration.skeleton_hash)
            .filter(|hash| !hash.is_empty())
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'static WorkflowRegistration> {
        self.by_name
            .get(name)
            .map(|(registration, _)| *registration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: WorkflowInput) -> BoxFuture<'static, Result<WorkflowOutput>> {
        Box::pin(async { WorkflowOutput::encode(&(), false) })
    }

    fn unit() -> String {
        crate::signature::of::<(), ()>()
    }

    fn takes_u32() -> String {
        crate::signature::of::<(u32,), ()>()
    }

    static A: WorkflowRegistration = WorkflowRegistration::new("pay", "shop::pay", never, unit);
    static B: WorkflowRegistration = WorkflowRegistration::new("pay", "billing::pay", never, unit);
    static C: WorkflowRegistration =
        WorkflowRegistration::new("ship", "shop::ship", never, takes_u32);

    #[test]
    fn duplicate_names_are_refused_naming_both_functions() {
        let err = Registry::from_iter([&A, &C, &B]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("`pay`"), "{text}");
        assert!(
            text.contains("billing::pay") && text.contains("shop::pay"),
            "{text}"
        );
    }

    #[test]
    fn distinct_names_are_collected() {
        let registry = Registry::from_iter([&A, &C]).unwrap();
        assert_eq!(registry.get("pay").unwrap().fn_path, "shop::pay");
        assert!(registry.get("nope").is_none());
        assert_eq!(
            registry.workflows(),
            [
                Registered {
                    name: "pay",
                    signature: "()->()"
                },
                Registered {
                    name: "ship",
                    signature: "(u32,)->()"
                }
            ]
        );
    }
}
