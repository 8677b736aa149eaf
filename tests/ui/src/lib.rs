//! Compile-fail cases of `#[workflow]`, `#[step]` and keiro's other macros:
//! each program in `fail/` must be rejected with the error checked in next to
//! it (`tests/compile_fail.rs`). This crate has no code of its own; it exists
//! so trybuild checks the cases against keiro with one backend and only the
//! dependencies the cases name.
