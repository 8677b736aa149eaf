//! Child processes whose wall clock is shifted by libfaketime (Debian's
//! `faketime`, which `.ci/run` installs), for the tests of workers and
//! commands whose clocks disagree with the database server's.

use std::path::Path;

/// libfaketime's thread-safe build: preloaded, it shifts the child's wall
/// clock (and not its monotonic one) by the offset in a file it re-reads
/// at every reading.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The environment that shifts a child's clock by what `offset` holds
/// (`+30s`, `-1s`, `+0s`, …); panics, saying what to install, when
/// libfaketime is missing.
pub fn shifted_env(offset: &Path) -> [(&'static str, &str); 4] {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's `faketime` (.ci/run does)"
    );
    [
        ("LD_PRELOAD", LIBFAKETIME),
        (
            "FAKETIME_TIMESTAMP_FILE",
            offset.to_str().expect("a UTF-8 path"),
        ),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
}
