//! Compile-time behaviour of `#[workflow]` and `#[step]`: every misuse in
//! `fail` is rejected with the error checked in next to it. The programs in
//! `pass` compile and run as part of `keiro-tests`' `tests/ui_pass.rs`.
//!
//! Only compile-fail cases go through trybuild: with no `pass` case trybuild
//! runs `cargo check` (no code generation, no linking) and checks all cases in
//! one cargo invocation, where a single `pass` case makes it `cargo build` every
//! dependency and then each case one at a time.
//!
//! Regenerate the expected errors with
//! `TRYBUILD=overwrite cargo test -p keiro-ui-tests`, then review the diff.

#[test]
fn compile_fail() {
    let t = trybuild::TestCases::new();
    t.compile_fail("fail/*.rs");
}
