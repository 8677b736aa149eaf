//! Several processes opening one fresh SQLite file at the same moment all
//! succeed, and the schema they leave is complete. Real child processes, each
//! with its own pool, like workers started together.

use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

const OPEN: &str = env!("CARGO_BIN_EXE_open_store");
const PROCESSES: usize = 8;
const FILES: usize = 10;

#[tokio::test]
async fn concurrent_first_opens_of_a_fresh_sqlite_file_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..FILES {
        let path = dir.path().join(format!("race-{round}.db"));
        let url = format!("sqlite://{}", path.display());
        // Every child waits until the same instant, so the opens overlap even
        // though the children start one after another.
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 300;
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| {
                Command::new(OPEN)
                    .arg(&url)
                    .arg(start.to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn open_store")
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: an open failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The schema is complete: every migration is recorded as applied, once.
        let store = keiro_store::Store::connect(&url, &keiro_store::StoreOptions::default())
            .await
            .unwrap();
        let keiro_store::Store::Sqlite(sqlite) = &store else {
            unreachable!("a sqlite URL opens the SQLite store")
        };
        let applied: Vec<(i64, bool)> =
            sqlx::query_as("SELECT version, success FROM _sqlx_migrations ORDER BY version")
                .fetch_all(sqlite.pool())
                .await
                .unwrap();
        let expected: Vec<(i64, bool)> = keiro_store::SQLITE_MIGRATOR
            .iter()
            .map(|m| (m.version, true))
            .collect();
        assert_eq!(applied, expected, "round {round}");
    }
}
