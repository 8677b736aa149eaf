//! The warnings a test binary logs, captured in memory so a test can check
//! what keiro warned of. Each test binary has its own capture: the runtime's
//! tasks log from any thread, so the subscriber is the process's global one.

use std::sync::Mutex;

/// Everything logged at `warn` and above since [`capture`] first ran.
static WARNINGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Sends every warning of this process to the capture (once per process).
pub fn capture() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .with_ansi(false)
            .with_writer(|| Captured)
            .init();
    });
}

/// The warnings captured so far, as text.
pub fn logged() -> String {
    String::from_utf8_lossy(&WARNINGS.lock().unwrap()).into_owned()
}

/// Appends what it is given to [`WARNINGS`].
struct Captured;

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        WARNINGS.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
