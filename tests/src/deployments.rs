//! Simulated deployments for in-process tests of code changes: which
//! version of a workflow's code is "deployed" for one test key, so a test
//! can record an instance under one version and replay it under another.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

fn versions() -> &'static Mutex<HashMap<String, u32>> {
    static VERSIONS: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    VERSIONS.get_or_init(Default::default)
}

/// Deploys `version` of the code for test key `key`.
pub fn deploy(key: &str, version: u32) {
    versions().lock().unwrap().insert(key.to_owned(), version);
}

/// The version deployed for test key `key` (1 until [`deploy`] says else).
pub fn version(key: &str) -> u32 {
    versions().lock().unwrap().get(key).copied().unwrap_or(1)
}
