//! Compile-time behaviour of `#[workflow]` and `#[step]`: every misuse in
//! `ui/fail` is rejected with the error checked in next to it, and every
//! program in `ui/pass` compiles and runs.
//!
//! Regenerate the expected errors with
//! `TRYBUILD=overwrite cargo test -p keiro-tests --test ui`, then review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
