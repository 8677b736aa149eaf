//! Raw access to keiro's storage, for keiro's own tests, benchmarks and
//! operator tools.
//!
//! **Unstable:** what this module hands out bypasses every invariant keiro
//! keeps (leases, generations, journal order, executor identities), and it may
//! change or go away in any release without notice. Applications read through
//! [`crate::inspect::StoreView`] and change state through keiro's own calls.

use crate::Keiro;

/// The raw store under `keiro`: every mutator of the journal, instance,
/// executor and timer tables. Bypasses every invariant; for tests and tools;
/// may change without notice.
pub fn raw_store(keiro: &Keiro) -> &keiro_store::Store {
    keiro.raw_store()
}

/// The raw store under `timers` (see [`raw_store`]). Bypasses every
/// invariant; for tests and tools; may change without notice.
pub fn raw_timer_store(timers: &crate::timers::Timers) -> &keiro_store::Store {
    timers.raw()
}
