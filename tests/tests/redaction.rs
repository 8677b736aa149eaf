//! A database URL's credentials never show: not in `KeiroBuilder`'s `Debug`,
//! not in the `Display` or `Debug` of the error a failed connect returns, on
//! either backend.

use keiro::Keiro;

/// Asserts `text` holds no `hunter` (every secret below starts so).
fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains("hunter"), "{what} shows a secret: {text}");
}

#[tokio::test]
async fn urls_are_redacted_in_debug_and_errors() {
    for url in [
        // PostgreSQL on port 1: the connection is refused at once.
        "postgres://u:hunter2@127.0.0.1:1/db?password=hunter3",
        "postgresql://u:hunt@er@127.0.0.1:1/db?sslmode=disable&PassWord=hunter4&application_name=a",
        // SQLite refuses the unknown parameter.
        "sqlite:/nonexistent/keiro.db?password=hunter5",
    ] {
        let builder = Keiro::builder(url);
        let debug = format!("{builder:?}");
        assert_hidden("the builder's Debug", &debug);
        assert!(debug.contains("***"), "{debug}");
        let error = builder
            .connect()
            .await
            .expect_err("nothing listens on port 1 and SQLite refuses `password`");
        let display = error.to_string();
        assert_hidden("the connect error's Display", &display);
        assert!(display.contains("***"), "{display}");
        assert_hidden("the connect error's Debug", &format!("{error:?}"));
    }
}
