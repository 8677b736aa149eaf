//! Workflows defined in a library crate of their own. A worker binary that
//! depends on this crate but never names it would lose them at link time;
//! `keiro::link!(keiro_test_linked)` keeps them.

/// Greets `name`: the workflow the link test looks for.
#[keiro::workflow(name = "linked_greeting")]
pub async fn linked_greeting(name: String) -> String {
    format!("hello, {name}")
}
