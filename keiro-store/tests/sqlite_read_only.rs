//! A SQLite database keiro cannot write is refused at connect, with its path,
//! instead of failing at the first journal write much later.

use std::process::Command;

use keiro_store::{Store, StoreError, StoreOptions};

/// A migrated keiro database in a fresh directory.
async fn migrated_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join("keiro.db");
    let store = Store::connect(
        &format!("sqlite://{}", path.display()),
        &StoreOptions::default(),
    )
    .await
    .expect("create and migrate the database");
    store.close().await;
    (dir, path)
}

#[tokio::test]
async fn a_database_opened_read_only_is_refused_at_connect_naming_its_path() {
    let (_dir, path) = migrated_file().await;
    let url = format!("sqlite://{}?mode=ro", path.display());
    let error = Store::connect(&url, &StoreOptions::default())
        .await
        .expect_err("a read-only database must be refused at connect");
    assert!(matches!(error, StoreError::ReadOnly { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("read-only"), "{message}");
    assert!(
        !error.is_transient(),
        "a read-only file does not heal itself"
    );
}

#[tokio::test]
async fn a_database_on_a_read_only_filesystem_is_refused_at_connect_naming_its_path() {
    let (dir, _path) = migrated_file().await;
    // A read-only bind mount of the directory (root only; CI runs as root).
    let mount = tempfile::tempdir().expect("create a mount point");
    let bound = Command::new("mount")
        .args(["--bind", "-o", "ro"])
        .arg(dir.path())
        .arg(mount.path())
        .output()
        .expect("run mount");
    if !bound.status.success() {
        let reason = String::from_utf8_lossy(&bound.stderr);
        assert!(
            std::env::var("CI").is_err(),
            "CI must run the read-only filesystem test: {reason}"
        );
        eprintln!("skipped: needs a read-only bind mount ({reason}); run as root");
        return;
    }
    let ro_path = mount.path().join("keiro.db");
    let result = Store::connect(
        &format!("sqlite://{}", ro_path.display()),
        &StoreOptions::default(),
    )
    .await;
    let _ = Command::new("umount").arg("-l").arg(mount.path()).status();
    let error = result.expect_err("a database on a read-only filesystem must be refused");
    let message = error.to_string();
    assert!(
        message.contains(&ro_path.display().to_string()),
        "{message}"
    );
    assert!(!error.is_transient(), "{error:?} does not heal itself");
}
