//! A SQLite worker survives a full disk: while the filesystem holding the
//! database has no space, writes fail; once space returns, the same process
//! (no restart) journals the steps and finishes every workflow. A
//! transactional step's body meeting the full disk is retried likewise.
//!
//! The database lives on a small tmpfs the test mounts, so filling it is quick
//! and touches nothing else. Mounting needs root (CI runs as root); elsewhere
//! the test says it is skipped, except under `CI=true`, where not being able
//! to mount is a failure.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keiro::{step, workflow, Keiro, ResumeOptions, WorkflowHandle, WorkflowStatus};

/// Step bodies wait here until the disk is full, so their results are the
/// writes that meet it.
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// How many times each (workflow key, step) body ran.
static RUNS: Mutex<Option<HashMap<(String, u32), u32>>> = Mutex::new(None);

/// Bytes in one step result: big enough that the journal must grow to take it.
const RESULT_BYTES: usize = 128 * 1024;

/// A step whose result needs fresh space in the database.
#[step]
async fn bulky(key: String, n: u32) -> String {
    while !GATE_OPEN.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    *RUNS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry((key, n))
        .or_default() += 1;
    format!("{n}{}", "x".repeat(RESULT_BYTES))
}

/// Three bulky steps; returns the total length of their results.
#[workflow]
async fn bulky_three(key: String) -> usize {
    let mut total = 0;
    for n in 1..=3 {
        total += bulky(key.clone(), n).await.len();
    }
    total
}

/// A tmpfs mounted for this test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `megabytes`, or says why it cannot.
    fn mount(megabytes: u32) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("create a mount point: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: on a failed assertion the pool may still hold the file open.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes `path` until the filesystem refuses more, and returns its size.
fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("create the filler file");
    let chunk = vec![0xA5u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
            Err(e) => panic!("fill {}: {e}", path.display()),
        }
    }
    let _ = file.sync_all();
    written
}

/// ENOSPC on Linux.
const fn libc_enospc() -> i32 {
    28
}

async fn status_of(handle: &WorkflowHandle<usize>) -> String {
    match handle.status().await {
        Ok(status) => format!("{status:?}"),
        Err(e) => format!("status unreadable: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_worker_recovers_by_itself_once_a_full_disk_has_space_again() {
    let tmpfs = match Tmpfs::mount(24) {
        Ok(tmpfs) => tmpfs,
        Err(reason) if std::env::var("CI").is_err() => {
            eprintln!("skipped: the disk-full test needs to mount a tmpfs ({reason}); run as root");
            return;
        }
        Err(reason) => panic!("CI must run the disk-full test: {reason}"),
    };
    let db: PathBuf = tmpfs.path().join("keiro.db");
    let url = format!("sqlite:{}", db.display());
    let keiro = Keiro::builder(&url)
        .executor_id("disk-full-worker")
        .lease_ttl(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    let worker = keiro
        .resume_worker(
            ResumeOptions::default()
                .poll_interval(Duration::from_millis(200))
                .log(|_| {}),
        )
        .await
        .expect("start the resume worker");

    let keys: Vec<String> = (0..6).map(|i| format!("disk-full-{i}")).collect();
    let mut handles = Vec::new();
    for key in &keys {
        let handle = bulky_three(key.clone())
            .id(key)
            .on(&keiro)
            .start()
            .await
            .expect("start before the disk fills");
        handles.push(handle);
    }

    // No space left: the steps' results cannot be journaled.
    let filler = tmpfs.path().join("filler");
    let filled = fill(&filler);
    assert!(filled > 0, "the filler took no space");
    GATE_OPEN.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(4)).await;
    for handle in &handles {
        assert!(
            !matches!(handle.status().await, Ok(WorkflowStatus::Completed)),
            "{} completed although the disk was full",
            handle.id()
        );
    }

    // Space returns: the same process finishes everything, unaided.
    std::fs::remove_file(&filler).expect("free the disk");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pending: Vec<&WorkflowHandle<usize>> = handles.iter().collect();
    while !pending.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        for handle in pending {
            if !matches!(handle.status().await, Ok(WorkflowStatus::Completed)) {
                still.push(handle);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut report = Vec::new();
    for handle in &pending {
        report.push(format!("{}: {}", handle.id(), status_of(handle).await));
    }
    assert!(
        pending.is_empty(),
        "60 s after space returned, still not completed: {report:?}"
    );
    for key in &keys {
        let out = bulky_three(key.clone())
            .id(key)
            .on(&keiro)
            .await
            .expect("the completed result");
        assert_eq!(out, 3 * (RESULT_BYTES + 1), "{key}");
    }
    worker.shutdown().await;
}

/// Transactional-step bodies wait here until the disk is full.
static TX_GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// Bytes in one application row: more than SQLite's page cache holds, so
/// the insert itself must write to the full disk.
const ROW_BYTES: usize = 12 * 1024 * 1024;

/// Inserts one bulky application row in keiro's transaction.
#[step(transaction, max_attempts = 1000, backoff_ms = 100)]
async fn bulky_entry(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    while !TX_GATE_OPEN.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    *RUNS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry((key.clone(), 0))
        .or_default() += 1;
    let mut db = tx.sqlite().expect("SQLite");
    sqlx::query("INSERT INTO bulky_rows (k, body) VALUES ($1, $2)")
        .bind(&key)
        .bind(vec![0x5Au8; ROW_BYTES])
        .execute(&mut db)
        .await
        .map(|_| 1)
        .map_err(|e| e.to_string())
}

#[workflow]
async fn one_bulky_entry(key: String) -> Result<u32, String> {
    bulky_entry(key).await
}

/// A transactional step on a full disk: the body's insert fails with
/// SQLITE_FULL, nothing commits, the step is retried per `max_attempts`,
/// and once space returns it commits once. The instance never fails for
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_step_on_a_full_disk_commits_once_space_returns() {
    let tmpfs = match Tmpfs::mount(40) {
        Ok(tmpfs) => tmpfs,
        Err(reason) if std::env::var("CI").is_err() => {
            eprintln!("skipped: the disk-full test needs to mount a tmpfs ({reason}); run as root");
            return;
        }
        Err(reason) => panic!("CI must run the disk-full test: {reason}"),
    };
    let url = format!("sqlite:{}", tmpfs.path().join("keiro.db").display());
    let keiro = Keiro::builder(&url).connect().await.expect("connect");
    let keiro_store::Store::Sqlite(store) = keiro::unstable::raw_store(&keiro) else {
        panic!("a SQLite store");
    };
    sqlx::query("CREATE TABLE bulky_rows (k TEXT PRIMARY KEY, body BLOB NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let key = "tx-disk-full".to_string();
    let handle = one_bulky_entry(key.clone())
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .expect("start before the disk fills");
    let filler = tmpfs.path().join("filler");
    assert!(fill(&filler) > 0, "the filler took no space");
    TX_GATE_OPEN.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = status_of_tx(&handle).await;
    assert!(
        status.contains("Running") || status.contains("Pending"),
        "on a full disk: {status}"
    );
    std::fs::remove_file(&filler).expect("free the disk");
    let out = tokio::time::timeout(Duration::from_secs(60), handle.result())
        .await
        .expect("the step commits once space returns")
        .expect("the workflow's result");
    assert_eq!(out, Ok(1));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bulky_rows WHERE k = $1")
        .bind(&key)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let runs = RUNS.lock().unwrap().as_ref().unwrap()[&(key.clone(), 0)];
    assert!(
        runs >= 2,
        "the body ran {runs} time(s): the disk was never full for it"
    );
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
}

async fn status_of_tx(handle: &WorkflowHandle<Result<u32, String>>) -> String {
    match handle.status().await {
        Ok(status) => format!("{status:?}"),
        Err(e) => format!("status unreadable: {e}"),
    }
}
