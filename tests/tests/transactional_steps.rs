//! `#[step(transaction)]`, on both backends: the application's writes and
//! the step's journal row commit together; replay returns the journaled
//! result without running the body; an `Err` rolls the writes back; a step
//! another executor journaled first keeps that result and these writes roll
//! back; concurrent debits of one account (beside plain steps going through
//! the group-commit writer) leave the balance exact; on PostgreSQL a
//! deadlock or serialization failure a statement of the body meets runs the
//! step again by default, while any other error is journaled at once. The
//! SIGKILL between the writes and the commit is in `transactional_crash.rs`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro::{step, workflow, Keiro, StepOutcome, WorkflowStatus};
use keiro_store::StepRow;
use keiro_tests::transactional::{
    bank, close_gate, debit, echo, late_debit, open_bank, pay, pay_flaky, pay_many, pay_slowly,
    BankError,
};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};

/// Per test key: whether [`wait_for_the_test`] may return.
static GATES: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());

/// Waits (without a transaction) until the test opens `key`'s gate.
#[step]
async fn wait_for_the_test(key: String) {
    GATES.lock().unwrap().push((key.clone(), false));
    loop {
        let open = GATES
            .lock()
            .unwrap()
            .iter()
            .any(|(k, open)| *k == key && *open);
        if open {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A debit racing a half-second sleep, after the test's gate.
#[workflow]
async fn debit_or_nap(key: String) -> Result<String, BankError> {
    wait_for_the_test(key.clone()).await;
    keiro::select! {
        paid = debit(key.clone(), key, 10) => paid.map(|_| "debit".to_owned()),
        _ = keiro::sleep(Duration::from_millis(500)) => Ok("nap".to_owned()),
    }
}

/// Waits until `key`'s gate is waited on.
async fn gate_reached(key: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !GATES.lock().unwrap().iter().any(|(k, _)| k == key) {
        assert!(
            std::time::Instant::now() < deadline,
            "the gate was never reached"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `key`'s gate is waited on, then opens it.
async fn open_the_gate(key: &str) {
    gate_reached(key).await;
    for gate in GATES.lock().unwrap().iter_mut().filter(|(k, _)| k == key) {
        gate.1 = true;
    }
}

/// A transactional step whose branch of a select lost in another
/// executor's run (one that took the instance over while this body ran
/// and journaled the select's decision for the other branch) rolls its
/// writes back: the instance follows that decision, and the debit that
/// never ran to a result there leaves no trace.
async fn a_transactional_branch_that_lost_elsewhere_rolls_its_writes_back(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    // Where the select's decision goes: read off a run that decides it.
    let probe = format!("probe-{}", uuid::Uuid::new_v4());
    let run = {
        let (keiro, probe) = (keiro.clone(), probe.clone());
        tokio::spawn(async move { debit_or_nap(probe.clone()).id(&probe).on(&keiro).await })
    };
    open_the_gate(&probe).await;
    assert_eq!(run.await.unwrap().unwrap(), Ok("debit".to_owned()));
    assert_eq!(bank(store).await, (90, 1));
    let steps = store.load_journal(&probe, 0).await.unwrap();
    let decision = steps
        .iter()
        .find(|row| row.kind == "select")
        .unwrap_or_else(|| panic!("no select decision in {steps:?}"));
    assert_eq!(decision.result, "0", "the debit branch won the probe");
    // The race: the decision for the sleep is journaled (as by another
    // executor) after the run loaded its journal, before the debit commits.
    let key = uuid::Uuid::new_v4().to_string();
    let run = {
        let (keiro, key) = (keiro.clone(), key.clone());
        tokio::spawn(async move { debit_or_nap(key.clone()).id(&key).on(&keiro).await })
    };
    // The gate is not opened yet: the row goes in first.
    gate_reached(&key).await;
    let insert = format!(
        "INSERT INTO {steps} (workflow_id, generation, seq, name, kind, result, created_at) \
         VALUES ($1, 0, $2, 'select', 'select', '1', $3)",
        steps = match backend {
            Backend::Sqlite => "keiro_steps",
            _ => "keiro.steps",
        }
    );
    let now = keiro_store::now_us();
    let inserted = match store {
        keiro_store::Store::Sqlite(s) => sqlx::query(&insert)
            .bind(&key)
            .bind(decision.seq)
            .bind(now)
            .execute(s.pool())
            .await
            .map(drop),
        keiro_store::Store::Postgres(p) => sqlx::query(&insert)
            .persistent(false)
            .bind(&key)
            .bind(decision.seq)
            .bind(now)
            .execute(p.pool())
            .await
            .map(drop),
    };
    inserted.expect("journal the decision as another executor would");
    open_the_gate(&key).await;
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the run ends in time")
        .unwrap()
        .unwrap();
    assert_eq!(
        out,
        Ok("nap".to_owned()),
        "the decision journaled first stands"
    );
    assert_eq!(
        bank(store).await,
        (90, 1),
        "the losing debit's writes stayed"
    );
    let journaled = store.load_journal(&key, 0).await.unwrap();
    assert!(
        !journaled.iter().any(|row| row.name == "debit"),
        "the losing debit was journaled: {journaled:?}"
    );
}

/// A fresh database whose account 1 holds `balance`, and a runtime on it.
async fn bank_on(backend: Backend, balance: i64) -> (TestDb, Keiro) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    open_bank(keiro::unstable::raw_store(&keiro), balance).await;
    (db, keiro)
}

/// The PostgreSQL store behind `keiro`.
fn postgres(keiro: &Keiro) -> &keiro_store::PostgresStore {
    match keiro::unstable::raw_store(keiro) {
        keiro_store::Store::Postgres(pg) => pg,
        #[allow(unreachable_patterns)]
        _ => panic!("a PostgreSQL store"),
    }
}

/// A fresh PostgreSQL database holding the table `create` makes, and a
/// runtime on it.
async fn postgres_with(create: &str) -> (TestDb, Keiro) {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    sqlx::query(create)
        .execute(postgres(&keiro).pool())
        .await
        .unwrap();
    (db, keiro)
}

/// Test keys whose next `maybe_crash` call panics once.
static CRASH_ONCE: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[step]
async fn maybe_crash(key: String) {
    let mut armed = CRASH_ONCE.lock().unwrap();
    if let Some(i) = armed.iter().position(|k| *k == key) {
        armed.remove(i);
        drop(armed);
        panic!("crash requested for {key}");
    }
}

/// A debit, then a step that may crash the run.
#[workflow]
async fn pay_then_crash(key: String, entry: String, cents: i64) -> Result<i64, BankError> {
    let balance = debit(key.clone(), entry, cents).await?;
    maybe_crash(key).await;
    Ok(balance)
}

async fn writes_and_result_commit_together_and_replay_skips_the_body(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 1000).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    CRASH_ONCE.lock().unwrap().push(key.clone());
    let crashed = pay_then_crash(key.clone(), "e1".into(), 250)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(
        matches!(crashed, keiro::Error::Panicked { .. }),
        "{crashed}"
    );
    // The run died after the debit: its writes and its result are in.
    assert_eq!(bank(store).await, (750, 1));
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!((steps[0].seq, steps[0].name.as_str()), (0, "debit"));
    assert_eq!(steps[0].outcome, StepOutcome::Ok);
    assert_eq!(steps[0].value, serde_json::json!(750));
    assert_eq!(steps[0].attempts, Some(1));
    assert!(steps[0].started_at.is_some());

    // The rerun replays the debit from the journal: no second body, no
    // second transaction's writes.
    let out = pay_then_crash(key.clone(), "e1".into(), 250)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(750));
    assert_eq!(count(&key, "debit"), 1, "the debit's body ran again");
    assert_eq!(bank(store).await, (750, 1));
    let handle = keiro.handle::<Result<i64, BankError>>(&key).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);
}

async fn an_err_rolls_the_writes_back_and_is_journaled(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    // The body inserts the ledger row and takes the balance to -400 before
    // it returns `Err`: neither write may remain.
    let out = pay(key.clone(), "too-much".into(), 500)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Err(BankError::Insufficient));
    assert_eq!(
        bank(store).await,
        (100, 0),
        "the failed debit's writes stayed"
    );
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!((steps[1].seq, steps[1].name.as_str()), (1, "debit"));
    assert_eq!(steps[1].outcome, StepOutcome::Err);
    assert_eq!(steps[1].value, serde_json::json!("Insufficient"));

    // The same entry debits fine afterwards: nothing of it was committed.
    let key2 = uuid::Uuid::new_v4().to_string();
    let out = pay(key2.clone(), "too-much".into(), 60)
        .id(&key2)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(40));
    assert_eq!(bank(store).await, (40, 1));
}

async fn failed_attempts_roll_back_and_the_retry_commits(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    // Every attempt inserts the same ledger entry: a write left by a failed
    // attempt would make the next one fail on the primary key.
    let out = pay_flaky(key.clone(), "flaky".into(), 30)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(70));
    assert_eq!(count(&key, "flaky_debit"), 3);
    assert_eq!(bank(store).await, (70, 1));
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps[0].attempts, Some(3));
}

async fn an_attempt_out_of_time_rolls_back(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let out = pay_slowly(key.clone(), "slow".into(), 10)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    let error = out.unwrap_err();
    assert!(error.contains("slow_debit"), "{error}");
    assert_eq!(
        bank(store).await,
        (100, 0),
        "the timed-out debit's writes stayed"
    );
}

/// PostgreSQL: `timeout_ms` bounds an attempt whose statement waits on a row
/// another session holds locked: the step ends out of time about when its
/// limit says, not when the other session lets go, and nothing of it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_attempt_blocked_on_a_lock_times_out_in_time() {
    let (_db, keiro) = bank_on(Backend::Postgres, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let mut holder = postgres(&keiro).pool().begin().await.unwrap();
    sqlx::query("SELECT balance FROM tx_accounts WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let began = std::time::Instant::now();
    let call = pay_slowly(key.clone(), "blocked".into(), 10)
        .id(&key)
        .on(&keiro);
    let run = tokio::spawn(async move { call.await });
    let out = tokio::time::timeout(Duration::from_secs(8), run).await;
    let took = began.elapsed();
    holder.rollback().await.unwrap();
    let out = out
        .expect("the step waited for the lock, past its timeout_ms of 50")
        .unwrap()
        .unwrap();
    let error = out.unwrap_err();
    assert!(error.contains("slow_debit"), "{error}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(bank(store).await, (100, 0));
}

/// The statement and idle limits of the transaction the body runs in.
async fn session_limits(tx: &mut keiro::Transaction<'_>) -> Result<(String, String), String> {
    let tx = tx.as_postgres().expect("PostgreSQL");
    sqlx::query_as(
        "SELECT current_setting('statement_timeout'), \
         current_setting('idle_in_transaction_session_timeout')",
    )
    .fetch_one(&mut **tx)
    .await
    .map_err(|e| e.to_string())
}

/// [`session_limits`] of a step whose attempts have 2 s.
#[step(transaction, timeout_ms = 2000)]
async fn timed_limits(tx: &mut keiro::Transaction<'_>) -> Result<(String, String), String> {
    session_limits(tx).await
}

/// [`session_limits`] of a step without a time limit.
#[step(transaction)]
async fn untimed_limits(tx: &mut keiro::Transaction<'_>) -> Result<(String, String), String> {
    session_limits(tx).await
}

#[workflow]
async fn both_limits() -> Result<Vec<(String, String)>, String> {
    Ok(vec![timed_limits().await?, untimed_limits().await?])
}

/// PostgreSQL: a timed step's transaction may neither run a statement nor
/// sit idle much past the attempt's limit (the server ends a transaction a
/// vanished process left open, and its row locks with it); an untimed one
/// keeps the server's defaults, however long the application's code takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_timed_steps_transaction_cannot_outlast_its_limit_idle() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let limits = both_limits().id(&key).on(&keiro).await.unwrap().unwrap();
    assert_eq!(
        limits,
        [
            ("2100ms".to_owned(), "3100ms".to_owned()),
            ("0".to_owned(), "0".to_owned())
        ],
        "(statement, idle-in-transaction) limits of a timed and an untimed step"
    );
}

/// PostgreSQL: once a step's body returned, keiro's check that the body left
/// the transaction open also bounds the transaction's idle time (keiro's
/// statements follow back to back), so a process that vanishes between its
/// journal row and its commit leaves no step locked for hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_step_transaction_is_bounded_idle_once_its_body_returned() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    let mut tx = store.begin_step_tx().await.unwrap();
    async fn idle_limit(tx: &mut keiro_store::StepTx<'_>) -> String {
        let keiro_store::StepTx::Postgres(tx) = tx else {
            panic!("a PostgreSQL transaction")
        };
        sqlx::query_scalar("SELECT current_setting('idle_in_transaction_session_timeout')")
            .fetch_one(&mut **tx)
            .await
            .unwrap()
    }
    assert_eq!(idle_limit(&mut tx).await, "0", "the body's time is its own");
    tx.check_open().await.unwrap();
    assert_eq!(idle_limit(&mut tx).await, "5s", "keiro's statements follow");
    tx.rollback().await.unwrap();
}

async fn a_step_journaled_elsewhere_first_keeps_that_result(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let gate = close_gate(&key);
    let handle = pay(key.clone(), "raced".into(), 10)
        .id(&key)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    // The run has read its (empty) journal and waits in step 0. Another
    // executor journals the debit (step 1) meanwhile.
    while count(&key, "at the gate") == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let elsewhere = StepRow {
        workflow_id: key.clone(),
        generation: 0,
        seq: 1,
        name: "debit".into(),
        kind: "step".into(),
        result: r#"{"Ok":12345}"#.into(),
    };
    store.append_steps(&[elsewhere]).await.unwrap();
    gate.notify_one();
    assert_eq!(handle.result().await.unwrap(), Ok(12345));
    assert_eq!(count(&key, "debit"), 1, "the body ran here");
    assert_eq!(
        bank(store).await,
        (100, 0),
        "the debit journaled elsewhere first committed its writes here too"
    );
}

/// Text that would break a statement built by pasting it in: quotes,
/// backslashes, a statement separator, dollar quotes, escapes, non-ASCII.
const AWKWARD: &str =
    "it's \\'; COMMIT; DROP TABLE tx_ledger; -- $$ E'\\x00' \"q\" \u{e9}\u{1f980}\n\t";

async fn awkward_text_is_journaled_exactly(backend: Backend) {
    let (db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    for n in 0..3 {
        // The id and the result hold the awkward text; so does the row.
        let key = format!("{AWKWARD}{n}-{}", uuid::Uuid::new_v4());
        let entry = format!("{AWKWARD}{n}");
        let out = echo(key.clone(), entry.clone())
            .id(&key)
            .on(&keiro)
            .await
            .unwrap();
        assert_eq!(out, Ok(entry.clone()));
        let steps = keiro.steps(&key).await.unwrap();
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].outcome, StepOutcome::Ok);
        assert_eq!(steps[0].value, serde_json::json!(entry));
        assert_eq!(steps[0].attempts, Some(1));
        // Replay returns it from the journal without a second body.
        let again = echo(key.clone(), entry.clone())
            .id(&key)
            .on(&keiro)
            .await
            .unwrap();
        assert_eq!(again, Ok(entry));
        assert_eq!(count(&key, "echo_entry"), 1, "the body ran again");
    }
    // Every write committed once, and the connections the steps used went
    // back to the pool outside any transaction: a debit made after them
    // through the pool commits on its own.
    assert_eq!(bank(store).await, (97, 3));
    let key = uuid::Uuid::new_v4().to_string();
    assert_eq!(
        pay(key.clone(), "after".into(), 7)
            .id(&key)
            .on(&keiro)
            .await
            .unwrap(),
        Ok(90)
    );
    let reopened = db.keiro().await;
    assert_eq!(bank(keiro::unstable::raw_store(&reopened)).await, (90, 4));
}

async fn concurrent_debits_of_one_account_are_exact(backend: Backend) {
    debit_concurrently(backend, 4, 25).await;
}

/// More debiting workflows than the runtime's pool has connections (four on
/// SQLite): transactions waiting for the write lock or a connection, and the
/// group-commit writer among them, all get their turn.
async fn more_concurrent_debits_than_connections_all_finish(backend: Backend) {
    debit_concurrently(backend, 16, 5).await;
}

/// `workflows` concurrent workflows of `debits` one-cent debits of account
/// 1, each after a plain step: the balance is exact.
async fn debit_concurrently(backend: Backend, workflows: u32, debits: u32) {
    let (_db, keiro) = bank_on(backend, 1000).await;
    let store = keiro::unstable::raw_store(&keiro);
    let run = uuid::Uuid::new_v4().to_string();
    let mut handles = Vec::new();
    for w in 0..workflows {
        let key = format!("{run}-{w}");
        let handle = pay_many(key.clone(), debits, false)
            .id(&key)
            .on(&keiro)
            .start()
            .await
            .unwrap();
        handles.push((key, handle));
    }
    let mut last = Vec::new();
    for (key, handle) in handles {
        let out = tokio::time::timeout(std::time::Duration::from_secs(120), handle.result())
            .await
            .expect("the debits finish")
            .unwrap();
        last.push(out.unwrap());
        assert_eq!(count(&key, "debit"), debits as usize);
        assert_eq!(count(&key, "note"), debits as usize);
    }
    let total = i64::from(workflows * debits);
    assert_eq!(bank(store).await, (1000 - total, total));
    assert!(
        last.contains(&(1000 - total)),
        "the last debit saw {}: {last:?}",
        1000 - total
    );
}

/// Read-modify-write debits at SERIALIZABLE conflict with each other; the
/// conflicts roll back and run again until the balance is exact.
async fn serializable_conflicts_are_retried(backend: Backend) {
    if backend == Backend::Sqlite {
        return; // SQLite has one writer: its transactions never conflict.
    }
    let (_db, keiro) = bank_on(backend, 1000).await;
    let store = keiro::unstable::raw_store(&keiro);
    let run = uuid::Uuid::new_v4().to_string();
    let mut handles = Vec::new();
    for w in 0..4 {
        let key = format!("{run}-{w}");
        let handle = pay_many(key.clone(), 10, true)
            .id(&key)
            .on(&keiro)
            .start()
            .await
            .unwrap();
        handles.push((key, handle));
    }
    let mut runs = 0;
    for (key, handle) in handles {
        let out = tokio::time::timeout(std::time::Duration::from_secs(120), handle.result())
            .await
            .expect("the debits finish")
            .unwrap();
        assert!(out.is_ok(), "{out:?}");
        runs += count(&key, "serializable_debit");
    }
    assert_eq!(bank(store).await, (960, 40));
    eprintln!("{runs} bodies ran for 40 serializable debits");
}

/// Counts its run, sends instance `key` a message (on PostgreSQL that locks
/// the instance's row), then holds the transaction (and on SQLite the write
/// lock) for 1.2 s.
#[step(transaction)]
async fn hold_the_lock(tx: &mut keiro::Transaction<'_>, key: String) -> Result<String, String> {
    ran(&key, "hold");
    keiro::send_tx(tx, &key, "held", &1u32)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    Ok(key)
}

#[workflow]
async fn holds_the_lock(key: String) -> Result<String, String> {
    hold_the_lock(key).await
}

async fn a_body_holding_sqlites_write_lock_long_is_warned_about(backend: Backend) {
    keiro_tests::warnings::capture();
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("lock-{backend:?}");
    let out = holds_the_lock(key.clone())
        .id(key.clone())
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(key.clone()));
    let out_key = key;
    let logged = keiro_tests::warnings::logged();
    let warning = format!(
        "`hold_the_lock` of workflow `holds_the_lock` id `{out_key}` held SQLite's only write lock"
    );
    let warned = logged.lines().any(|line| line.contains(&warning));
    // On PostgreSQL a transaction locks only the rows it writes.
    assert_eq!(warned, backend == Backend::Sqlite, "{logged}");
}

/// Writes, then holds its transaction (and on SQLite the write lock) `ms`,
/// then returns whether a warning naming it as still running was logged
/// meanwhile.
#[step(transaction)]
async fn hold_and_look(
    tx: &mut keiro::Transaction<'_>,
    key: String,
    ms: u64,
) -> Result<bool, String> {
    let create = "CREATE TABLE IF NOT EXISTS held_rows (k TEXT)";
    let insert = "INSERT INTO held_rows (k) VALUES ($1)";
    let wrote = match tx.sqlite() {
        Some(mut db) => sqlx::query(create).execute(&mut db).await.map(drop),
        None => {
            let mut db = tx.postgres().expect("SQLite or PostgreSQL");
            match sqlx::query(create).execute(&mut db).await {
                Ok(_) => sqlx::query(insert)
                    .bind(&key)
                    .execute(&mut db)
                    .await
                    .map(drop),
                Err(error) => Err(error),
            }
        }
    };
    wrote.map_err(|e| e.to_string())?;
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    let logged = keiro_tests::warnings::logged();
    let named = format!("`hold_and_look` of workflow `holds_and_looks` id `{key}` has ");
    let held = match tx.sqlite() {
        Some(_) => "held SQLite's only write lock for",
        None => "kept its PostgreSQL transaction open for",
    };
    Ok(logged.lines().any(|line| {
        line.contains(&named) && line.contains("its body still runs") && line.contains(held)
    }))
}

#[workflow]
async fn holds_and_looks(key: String, ms: u64) -> Result<bool, String> {
    hold_and_look(key, ms).await
}

/// A body that holds its transaction (SQLite's write lock, 3 s; a
/// PostgreSQL transaction, 5 s) and has not returned is warned about while
/// it runs (a body stuck forever would otherwise never be named), not only
/// once it returns; one that returns a little earlier is not.
async fn a_body_still_holding_its_transaction_is_warned_about_while_it_runs(backend: Backend) {
    keiro_tests::warnings::capture();
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    // Just short of the backend's threshold, then past it.
    let (short, past) = match backend {
        Backend::Sqlite => (2600, 3400),
        _ => (4600, 5400),
    };
    let early = format!("{key}-early");
    let warned = holds_and_looks(early.clone(), short)
        .id(&early)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(warned, Ok(false), "warned before the threshold");
    let warned = holds_and_looks(key.clone(), past)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(warned, Ok(true), "no warning while the body ran");
}

async fn a_body_outlasting_a_lease_renewal_finishes_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Renewals every 200 ms: several fall while the body holds its
    // transaction. On SQLite each needs the write lock the body holds.
    let keiro = db
        .builder()
        .lease_ttl(std::time::Duration::from_millis(600))
        .connect()
        .await
        .unwrap();
    let key = format!("renew-{backend:?}-{}", uuid::Uuid::new_v4().simple());
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        holds_the_lock(key.clone()).id(key.clone()).on(&keiro),
    )
    .await
    .expect("the workflow ends while its lease renews");
    assert_eq!(out.unwrap(), Ok(key.clone()));
    assert_eq!(count(&key, "hold"), 1, "the body ran once");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// Calls another transactional step from its body.
#[step(transaction)]
async fn outer_tx(tx: &mut keiro::Transaction<'_>, key: String) -> Result<String, String> {
    let _ = tx;
    hold_the_lock(key).await
}

#[workflow]
async fn nests_transactions(key: String) -> Result<String, String> {
    outer_tx(key).await
}

async fn a_transactional_step_inside_anothers_body_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("nested-{backend:?}-{}", uuid::Uuid::new_v4().simple());
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        nests_transactions(key.clone()).id(key.clone()).on(&keiro),
    )
    .await
    .expect("refused at once, not after waiting for a lock")
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, keiro::Error::Panicked { .. })
            && text.contains(
                "`hold_the_lock` was called inside the body of transactional step `outer_tx`"
            ),
        "{text}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

/// Records that it ran.
#[step]
async fn after_debit(key: String) -> u32 {
    ran(&key, "after_debit");
    1
}

/// A debit that outlasts the run's deadline, then a plain step.
#[workflow]
async fn pays_late(key: String) -> Result<i64, String> {
    let balance = late_debit(key.clone(), format!("{key}-late"), 1).await?;
    after_debit(key).await;
    Ok(balance)
}

/// A transactional step still running at the run's deadline rolls back,
/// and no step after it starts: on both backends alike (on SQLite the
/// time-out waits for the write lock the step's transaction holds, and the
/// step used to commit and the workflow to go on meanwhile).
async fn a_transactional_step_running_at_the_deadline_rolls_back(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let key = format!("late-{backend:?}-{}", uuid::Uuid::new_v4().simple());
    let err = pays_late(key.clone())
        .id(key.clone())
        .timeout(Duration::from_millis(300))
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(matches!(err, keiro::Error::TimedOut { .. }), "{err}");
    assert_eq!(count(&key, "late_debit"), 1);
    assert_eq!(
        count(&key, "after_debit"),
        0,
        "a step ran after the deadline"
    );
    assert_eq!(
        bank(keiro::unstable::raw_store(&keiro)).await,
        (100, 0),
        "the debit committed after the deadline"
    );
}

/// The runtimes `pays_through_a_workflow` awaits its workflow on, by key.
static RUNTIMES: Mutex<Vec<(String, Keiro)>> = Mutex::new(Vec::new());

/// One debit of a cent, after a durable sleep that suspends the run (on a
/// runtime whose `suspend_after` is shorter).
#[workflow]
async fn pays_a_cent(key: String) -> Result<i64, BankError> {
    keiro::sleep(Duration::from_millis(300)).await;
    debit(key.clone(), format!("{key}-inner"), 1).await
}

/// Awaits [`pays_a_cent`] from its body: run here, in its own context.
#[step]
async fn pays_through_a_workflow(key: String) -> Result<i64, String> {
    let keiro = RUNTIMES
        .lock()
        .unwrap()
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, keiro)| keiro.clone())
        .ok_or("no runtime for the key")?;
    pays_a_cent(key.clone())
        .id(format!("{key}-inner"))
        .on(&keiro)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{e:?}"))
}

#[workflow]
async fn pays_from_a_step(key: String) -> Result<i64, String> {
    pays_through_a_workflow(key).await
}

/// A workflow awaited from a plain step's body runs in a context of its
/// own, where its transactional steps are journaled as anywhere: the
/// refusal of one called in a step's body is not for them, also when the
/// awaiting step runs it on itself (it suspended, and came due while the
/// step waited, with no worker to claim it).
async fn a_workflow_awaited_in_a_steps_body_runs_its_transactional_steps(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db
        .builder()
        .suspend_after(Duration::from_millis(10))
        .connect()
        .await
        .unwrap();
    open_bank(keiro::unstable::raw_store(&keiro), 100).await;
    let key = format!("through-{backend:?}-{}", uuid::Uuid::new_v4().simple());
    RUNTIMES.lock().unwrap().push((key.clone(), keiro.clone()));
    let out = pays_from_a_step(key.clone())
        .id(key.clone())
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(99));
    assert_eq!(bank(keiro::unstable::raw_store(&keiro)).await, (99, 1));
    let journaled = keiro::unstable::raw_store(&keiro)
        .load_journal(&format!("{key}-inner"), 0)
        .await
        .unwrap();
    assert!(
        journaled.iter().any(|row| row.name == "debit"),
        "the inner debit was not journaled: {journaled:?}"
    );
}

/// Calls a transactional step from a plain step's body.
#[step]
async fn settles(key: String) -> Result<String, String> {
    hold_the_lock(key).await
}

#[workflow]
async fn settles_in_a_step(key: String) -> Result<String, String> {
    settles(key).await
}

/// A transactional step called in a plain step's body (outside the
/// workflow's context) would commit with no journal row, again at each
/// retry of the plain step: it is refused, naming both steps, and writes
/// nothing.
async fn a_transactional_step_inside_a_plain_steps_body_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("in-step-{backend:?}-{}", uuid::Uuid::new_v4().simple());
    let err = settles_in_a_step(key.clone())
        .id(key.clone())
        .on(&keiro)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, keiro::Error::Panicked { .. })
            && text.contains("`hold_the_lock` was called inside the body of step `settles`"),
        "{text}"
    );
    assert_eq!(count(&key, "hold"), 0, "the transactional body ran");
}

/// Inserts key `k` twice into a table whose unique constraint is checked
/// at COMMIT, so the body returns `Ok` and its transaction cannot commit.
#[step(transaction)]
async fn insert_twice(tx: &mut keiro::Transaction<'_>, k: String) -> Result<u32, String> {
    let tx = tx.as_postgres().expect("PostgreSQL");
    for _ in 0..2 {
        sqlx::query("INSERT INTO tx_deferred (k) VALUES ($1)")
            .bind(&k)
            .execute(&mut **tx)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(2)
}

#[workflow]
async fn deferred_duplicate(k: String) -> Result<u32, String> {
    insert_twice(k).await
}

/// PostgreSQL: an application's deferred unique constraint that fails at
/// the step's COMMIT is an error of the step's run, never mistaken for the
/// step journaled elsewhere first: no result is journaled, and none of the
/// body's writes remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_deferred_constraint_failing_at_commit_journals_nothing() {
    deferred_failure_journals_nothing(
        "CREATE TABLE tx_deferred (k TEXT, CONSTRAINT tx_deferred_k UNIQUE (k) \
         DEFERRABLE INITIALLY DEFERRED)",
        "tx_deferred_k",
    )
    .await;
}

/// The same with the application's constraint named like the journal's
/// primary key (`steps_pkey`, PostgreSQL's default name for a table
/// `steps`): only keiro's own table says the step was journaled first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_deferred_constraint_named_like_the_journals_key_journals_nothing() {
    deferred_failure_journals_nothing(
        "CREATE TABLE tx_deferred (k TEXT, CONSTRAINT steps_pkey PRIMARY KEY (k) \
         DEFERRABLE INITIALLY DEFERRED)",
        "steps_pkey",
    )
    .await;
}

/// The same with a deferred trigger of the application's dividing by zero
/// at COMMIT: an error of the step's run, never taken for keiro's guard
/// (which says the body ended the transaction itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_application_error_at_commit_is_not_the_guard() {
    let (_db, keiro) = postgres_with("CREATE TABLE tx_deferred (k TEXT)").await;
    sqlx::raw_sql(
        "CREATE FUNCTION tx_boom() RETURNS trigger AS $$ BEGIN PERFORM 1 / 0; RETURN NULL; END \
         $$ LANGUAGE plpgsql; \
         CREATE CONSTRAINT TRIGGER tx_boom AFTER INSERT ON tx_deferred DEFERRABLE INITIALLY \
         DEFERRED FOR EACH ROW EXECUTE FUNCTION tx_boom()",
    )
    .execute(postgres(&keiro).pool())
    .await
    .unwrap();
    deferred_failure_in(&keiro, "division by zero").await;
}

async fn deferred_failure_journals_nothing(create: &str, constraint: &str) {
    let (_db, keiro) = postgres_with(create).await;
    deferred_failure_in(&keiro, constraint).await;
}

async fn deferred_failure_in(keiro: &Keiro, constraint: &str) {
    let pg = postgres(keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let out = deferred_duplicate(key.clone()).id(&key).on(keiro).await;
    let error = out.expect_err("the COMMIT cannot succeed");
    assert!(error.to_string().contains(constraint), "{error}");
    assert!(
        !error.to_string().contains("ended keiro's transaction"),
        "{error}"
    );
    let steps = keiro.steps(&key).await.unwrap();
    assert!(steps.is_empty(), "a result was journaled: {steps:?}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tx_deferred")
        .fetch_one(pg.pool())
        .await
        .unwrap();
    assert_eq!(rows, 0, "the body's writes stayed");
}

/// The server process and transaction id the step's body runs in.
#[step(transaction)]
async fn where_it_runs(tx: &mut keiro::Transaction<'_>) -> Result<(i32, i64), String> {
    let tx = tx.as_postgres().expect("PostgreSQL");
    sqlx::query_as("SELECT pg_backend_pid(), txid_current()")
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| e.to_string())
}

#[workflow]
async fn three_transactions() -> Result<Vec<(i32, i64)>, String> {
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(where_it_runs().await?);
    }
    Ok(seen)
}

/// PostgreSQL: a transactional step leaves its connection in an empty
/// transaction for the next one. Each step still runs in a transaction of
/// its own; the kept one goes back to the pool shortly after the last step
/// (no session is left idle in a transaction), and closing the store does
/// not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_transaction_kept_for_the_next_step_goes_back_to_the_pool() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro).clone();
    let pg = postgres(&keiro);
    let idle_in_transaction = "SELECT count(*) FROM pg_stat_activity WHERE datname = \
         current_database() AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()";
    for round in 0..2 {
        let key = uuid::Uuid::new_v4().to_string();
        let seen = three_transactions()
            .id(&key)
            .on(&keiro)
            .await
            .unwrap()
            .unwrap();
        let mut txids: Vec<i64> = seen.iter().map(|(_, txid)| *txid).collect();
        txids.dedup();
        assert_eq!(txids.len(), 3, "two steps shared a transaction: {seen:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let left: i64 = sqlx::query_scalar(idle_in_transaction)
                .fetch_one(pg.pool())
                .await
                .unwrap();
            if left == 0 && pg.pool().num_idle() == pg.pool().size() as usize {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: {left} sessions idle in a transaction, {} of {} pooled \
                 connections idle, 10 s after the last step",
                pg.pool().num_idle(),
                pg.pool().size()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    // Closing right after a step does not wait for the kept transaction.
    let key = uuid::Uuid::new_v4().to_string();
    three_transactions()
        .id(&key)
        .on(&keiro)
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), store.close())
        .await
        .expect("closing the store waited for the kept transaction");
}

/// Keys whose next `lose_connection_once` body kills its own connection.
static LOSE_ONCE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Loses its connection mid-body the first time for `key` (the server
/// terminates it, so the body's statement fails); then inserts `key`.
#[step(transaction)]
async fn lose_connection_once(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    let tx = tx.as_postgres().expect("PostgreSQL");
    let lose = {
        let mut armed = LOSE_ONCE.lock().unwrap();
        let at = armed.iter().position(|k| *k == key);
        at.map(|at| armed.remove(at)).is_some()
    };
    if lose {
        sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(&mut **tx)
            .await
            .map_err(|e| e.to_string())?;
    }
    sqlx::query("INSERT INTO tx_lost (k) VALUES ($1)")
        .bind(&key)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(if lose { 1 } else { 2 })
}

#[workflow]
async fn survive_a_lost_connection(key: String) -> Result<u32, String> {
    lose_connection_once(key).await
}

/// PostgreSQL: a transactional step whose connection is lost under its body
/// gets an `Err` from its statement; that `Err` is the lost connection, not
/// the step's outcome, so it is not journaled: the body runs again in a new
/// transaction and its result is journaled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_connection_lost_under_the_body_runs_it_again() {
    let (_db, keiro) = postgres_with("CREATE TABLE tx_lost (k TEXT PRIMARY KEY)").await;
    let pg = postgres(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    LOSE_ONCE.lock().unwrap().push(key.clone());
    let out = survive_a_lost_connection(key.clone())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(
        out,
        Ok(2),
        "the lost connection's error was the step's outcome"
    );
    assert!(
        LOSE_ONCE.lock().unwrap().is_empty(),
        "the connection was never lost"
    );
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].outcome, StepOutcome::Ok);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tx_lost WHERE k = $1")
        .bind(&key)
        .fetch_one(pg.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// Inserts `key` into `tx_shutdown`, whose deferred trigger refuses the
/// COMMIT with SQLSTATE 57P01 (a server shutting down): a transient error
/// that might, for all keiro can tell, come after the COMMIT took effect.
#[step(transaction)]
async fn commit_meets_a_shutdown(
    tx: &mut keiro::Transaction<'_>,
    key: String,
) -> Result<u32, String> {
    ran(&key, "commit_meets_a_shutdown");
    let mut db = tx.postgres().expect("PostgreSQL");
    sqlx::query("INSERT INTO tx_shutdown (k) VALUES ($1)")
        .bind(&key)
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    Ok(1)
}

/// The same outside a workflow (the body runs in a transaction of the
/// process-wide runtime): the lost connection's `Err` is not the call's
/// outcome, nothing had committed, so the body runs again, and the call
/// returns its result instead of panicking. A transient error at the
/// COMMIT itself is another matter: nothing outside a workflow journals
/// whether it took effect, so the body does not run again, and the call
/// panics saying so. (The only test of this file that sets the
/// process-wide runtime.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outside_a_workflow_a_connection_lost_under_the_body_runs_it_again() {
    let (_db, keiro) = postgres_with("CREATE TABLE tx_lost (k TEXT PRIMARY KEY)").await;
    keiro::init(keiro.clone()).unwrap();
    sqlx::raw_sql(
        "CREATE TABLE tx_shutdown (k TEXT); \
         CREATE FUNCTION tx_shutdown() RETURNS trigger AS $$ BEGIN \
         RAISE EXCEPTION 'shutting down (a test trigger)' USING ERRCODE = '57P01'; \
         END $$ LANGUAGE plpgsql; \
         CREATE CONSTRAINT TRIGGER tx_shutdown AFTER INSERT ON tx_shutdown DEFERRABLE \
         INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tx_shutdown()",
    )
    .execute(postgres(&keiro).pool())
    .await
    .unwrap();
    let key = uuid::Uuid::new_v4().to_string();
    let call = tokio::spawn(commit_meets_a_shutdown(key.clone()));
    let panicked = call.await.expect_err("the call panics");
    let payload = panicked.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("`commit_meets_a_shutdown`")
            && message.contains("may or may not have committed"),
        "{message}"
    );
    assert_eq!(count(&key, "commit_meets_a_shutdown"), 1, "ran again");

    let key = uuid::Uuid::new_v4().to_string();
    LOSE_ONCE.lock().unwrap().push(key.clone());
    let out = lose_connection_once(key.clone()).await;
    assert_eq!(out, Ok(2));
    assert!(
        LOSE_ONCE.lock().unwrap().is_empty(),
        "the connection was never lost"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tx_lost WHERE k = $1")
        .bind(&key)
        .fetch_one(postgres(&keiro).pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// Barriers of two bodies' first runs, by test run: each waits there
/// until the other has come as far (at most 10 s).
static MEETINGS: Mutex<Option<HashMap<String, Arc<tokio::sync::Barrier>>>> = Mutex::new(None);

/// Waits at test run `run`'s barrier of two, the first time `key`'s body
/// `what` runs; a later run goes straight on.
async fn meet_on_first_run(run: &str, key: &str, what: &str) {
    if count(key, what) > 1 {
        return;
    }
    let barrier = MEETINGS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(run.to_owned())
        .or_insert_with(|| Arc::new(tokio::sync::Barrier::new(2)))
        .clone();
    let _ = tokio::time::timeout(Duration::from_secs(10), barrier.wait()).await;
}

/// Moves `cents` from account `from` to account `to` of `tx_pair`: the row
/// lock on `from` first, then (on the first run, once the other transfer of
/// test run `run` holds its own first lock) the one on `to`. Two opposite
/// transfers deadlock. The body's statements go through the watched
/// connection, and its error is the statement's, as text, like most
/// bodies': no `retry_if`, no `max_attempts`.
#[step(transaction)]
async fn transfer(
    tx: &mut keiro::Transaction<'_>,
    run: String,
    key: String,
    from: i64,
    to: i64,
    cents: i64,
) -> Result<(i64, i64), String> {
    ran(&key, "transfer");
    let mut db = tx.postgres().expect("PostgreSQL");
    let add = "UPDATE tx_pair SET balance = balance + $1 WHERE id = $2 RETURNING balance";
    let left: i64 = sqlx::query_scalar(add)
        .bind(-cents)
        .bind(from)
        .fetch_one(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    meet_on_first_run(&run, &key, "transfer").await;
    let arrived: i64 = sqlx::query_scalar(add)
        .bind(cents)
        .bind(to)
        .fetch_one(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    Ok((left, arrived))
}

#[workflow]
async fn move_money(
    run: String,
    key: String,
    from: i64,
    to: i64,
    cents: i64,
) -> Result<(i64, i64), String> {
    transfer(run, key, from, to, cents).await
}

/// Takes `cents` from `tx_till` at SERIALIZABLE, reading the balance and
/// writing the difference back; on its first run it writes only once the
/// other withdrawal of test run `run` has read too. Of two, the second to
/// write fails with a serialization failure (40001).
#[step(transaction)]
async fn withdraw(
    tx: &mut keiro::Transaction<'_>,
    run: String,
    key: String,
    cents: i64,
) -> Result<i64, String> {
    ran(&key, "withdraw");
    let mut db = tx.postgres().expect("PostgreSQL");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM tx_till WHERE id = 1")
        .fetch_one(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    meet_on_first_run(&run, &key, "withdraw").await;
    sqlx::query("UPDATE tx_till SET balance = $1 WHERE id = 1")
        .bind(balance - cents)
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    Ok(balance - cents)
}

#[workflow]
async fn take_from_till(run: String, key: String, cents: i64) -> Result<i64, String> {
    withdraw(run, key, cents).await
}

/// A fresh PostgreSQL database whose table `table` holds `accounts`
/// (`id`, `balance`), and a runtime on it.
async fn postgres_accounts(table: &str, accounts: &[(i64, i64)]) -> (TestDb, Keiro) {
    let (db, keiro) = postgres_with(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)"
    ))
    .await;
    for (id, balance) in accounts {
        sqlx::query(&format!(
            "INSERT INTO {table} (id, balance) VALUES ($1, $2)"
        ))
        .bind(id)
        .bind(balance)
        .execute(postgres(&keiro).pool())
        .await
        .unwrap();
    }
    (db, keiro)
}

/// Table `table`'s balances, by id.
async fn balances(keiro: &Keiro, table: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(&format!("SELECT id, balance FROM {table} ORDER BY id"))
        .fetch_all(postgres(keiro).pool())
        .await
        .unwrap()
}

/// Waits for the workflow behind `handle`; its result.
async fn finished<R: serde::de::DeserializeOwned>(handle: keiro::WorkflowHandle<R>) -> R {
    tokio::time::timeout(Duration::from_secs(60), handle.result())
        .await
        .expect("the workflow finishes")
        .unwrap()
}

/// PostgreSQL: two transfers between the same two accounts in opposite
/// orders deadlock, and the server fails one body's `UPDATE` with 40P01.
/// That step runs again by default (no `retry_if`, no `max_attempts`),
/// whatever its body made of the error: both workflows end `Ok`, each step
/// journaled once, and the balances are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_deadlock_in_the_body_runs_the_step_again() {
    let (_db, keiro) = postgres_accounts("tx_pair", &[(1, 100), (2, 100)]).await;
    let run = uuid::Uuid::new_v4().to_string();
    let (a, b) = (format!("{run}-a"), format!("{run}-b"));
    let one_to_two = move_money(run.clone(), a.clone(), 1, 2, 10)
        .id(&a)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let two_to_one = move_money(run.clone(), b.clone(), 2, 1, 3)
        .id(&b)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let (one_to_two, two_to_one) = (finished(one_to_two).await, finished(two_to_one).await);
    assert!(one_to_two.is_ok(), "1 -> 2: {one_to_two:?}");
    assert!(two_to_one.is_ok(), "2 -> 1: {two_to_one:?}");
    assert_eq!(
        count(&a, "transfer") + count(&b, "transfer"),
        3,
        "the deadlock's victim ran again, once"
    );
    assert_eq!(balances(&keiro, "tx_pair").await, [(1, 93), (2, 107)]);
    for key in [&a, &b] {
        let steps = keiro.steps(key).await.unwrap();
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].outcome, StepOutcome::Ok, "{steps:?}");
        assert_eq!(steps[0].attempts, Some(count(key, "transfer") as u32));
    }
}

/// PostgreSQL: two read-then-write withdrawals at SERIALIZABLE; the second
/// to write fails with a serialization failure (40001) in its body. That
/// step runs again by default, reads the new balance, and both withdrawals
/// count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_serialization_failure_in_the_body_runs_the_step_again() {
    let (_db, keiro) = postgres_accounts("tx_till", &[(1, 100)]).await;
    let run = uuid::Uuid::new_v4().to_string();
    let (a, b) = (format!("{run}-a"), format!("{run}-b"));
    let first = take_from_till(run.clone(), a.clone(), 10)
        .id(&a)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let second = take_from_till(run.clone(), b.clone(), 3)
        .id(&b)
        .on(&keiro)
        .start()
        .await
        .unwrap();
    let (first, second) = (finished(first).await, finished(second).await);
    assert!(first.is_ok(), "{first:?}");
    assert!(second.is_ok(), "{second:?}");
    let mut left = [first.unwrap(), second.unwrap()];
    left.sort();
    assert!(left == [87, 90] || left == [87, 97], "{left:?}");
    assert_eq!(
        count(&a, "withdraw") + count(&b, "withdraw"),
        3,
        "the serialization failure's loser ran again, once"
    );
    assert_eq!(balances(&keiro, "tx_till").await, [(1, 87)]);
    for key in [&a, &b] {
        let steps = keiro.steps(key).await.unwrap();
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert_eq!(steps[0].outcome, StepOutcome::Ok, "{steps:?}");
    }
}

/// Inserts ledger entry `entry` twice through the watched connection: the
/// second insert fails on the primary key.
#[step(transaction)]
async fn enter_twice(
    tx: &mut keiro::Transaction<'_>,
    key: String,
    entry: String,
) -> Result<u32, String> {
    ran(&key, "enter_twice");
    let insert = "INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, 1)";
    for _ in 0..2 {
        let done = if let Some(mut db) = tx.sqlite() {
            sqlx::query(insert)
                .bind(&entry)
                .execute(&mut db)
                .await
                .map(drop)
        } else {
            let mut db = tx.postgres().expect("SQLite or PostgreSQL");
            sqlx::query(insert)
                .bind(&entry)
                .execute(&mut db)
                .await
                .map(drop)
        };
        done.map_err(|e| e.to_string())?;
    }
    Ok(2)
}

#[workflow]
async fn enter_a_duplicate(key: String, entry: String) -> Result<u32, String> {
    enter_twice(key, entry).await
}

/// Only a conflict runs the step again: another database error a statement
/// of the body meets on the watched connection (here a primary key
/// violation) rolls the writes back and is journaled at once.
async fn a_body_error_other_than_a_conflict_is_journaled_at_once(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let out = enter_a_duplicate(key.clone(), "twice".into())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert!(out.is_err(), "{out:?}");
    assert_eq!(count(&key, "enter_twice"), 1, "the body ran again");
    assert_eq!(bank(store).await, (100, 0), "the first insert stayed");
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].outcome, StepOutcome::Err);
}

/// Inserts ledger entry `entry`, then sends `end` (`COMMIT` or `ROLLBACK`)
/// on the sqlx transaction itself, then returns `Ok(1)`, or `Err` if `fail`.
#[step(transaction)]
async fn end_it_myself(
    tx: &mut keiro::Transaction<'_>,
    key: String,
    entry: String,
    end: String,
    fail: bool,
) -> Result<u32, String> {
    ran(&key, "end_it_myself");
    let insert = "INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, 1)";
    let done = if let Some(tx) = tx.as_sqlite() {
        let c: &mut sqlx::SqliteConnection = tx;
        sqlx::query(insert)
            .bind(&entry)
            .execute(&mut *c)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query(&end).execute(&mut *c).await.map(drop)
    } else {
        let c: &mut sqlx::PgConnection = tx.as_postgres().expect("SQLite or PostgreSQL");
        sqlx::query(insert)
            .persistent(false)
            .bind(&entry)
            .execute(&mut *c)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query(&end)
            .persistent(false)
            .execute(&mut *c)
            .await
            .map(drop)
    };
    done.map_err(|e| e.to_string())?;
    match fail {
        true => Err("failed after ending the transaction".into()),
        false => Ok(1),
    }
}

#[workflow]
async fn end_the_transaction(
    key: String,
    entry: String,
    end: String,
    fail: bool,
) -> Result<u32, String> {
    end_it_myself(key, entry, end, fail).await
}

/// A mark a body's `COMMIT; BEGIN` leaves on its connection (keiro's
/// cleanup ran in the body's own transaction, which then rolled back) does
/// not make a later rollback on that connection look like a commit: with
/// one connection in the pool, the next step's transaction that SQLite
/// rolls back itself is still retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_mark_left_on_the_connection_misleads_no_later_step() {
    let db = TestDb::new(Backend::Sqlite).await;
    let keiro = db.builder().max_connections(1).connect().await.unwrap();
    open_bank(keiro::unstable::raw_store(&keiro), 100).await;
    let key = uuid::Uuid::new_v4().to_string();
    let ended = end_the_transaction(
        key.clone(),
        "reopened".into(),
        "COMMIT; BEGIN".into(),
        false,
    )
    .id(&key)
    .on(&keiro)
    .await;
    assert!(ended.is_err(), "{ended:?}");
    let key = uuid::Uuid::new_v4().to_string();
    let out = survive_an_interrupt(key.clone(), "after-a-reopen".into(), false)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(1));
    assert_eq!(count(&key, "interrupted_once"), 2);
}

/// What the error says of a body's `end`: on SQLite keiro tells a rollback
/// from a commit (its mark).
fn expected_end(backend: Backend, end: &str) -> &'static str {
    match (backend, end) {
        (Backend::Sqlite, "ROLLBACK") => "rolled back under its body",
        _ => "ended keiro's transaction itself",
    }
}

/// A body that commits or rolls back keiro's transaction itself is caught
/// before the journal row is written: the instance fails with an error
/// naming the step, nothing is journaled, and the body does not run again
/// (whose committed writes would apply twice). A ROLLBACK's writes are gone;
/// a COMMIT's stay, as the body committed them.
async fn a_body_that_ends_the_transaction_itself_fails_the_instance(backend: Backend) {
    let (_db, keiro) = bank_on(backend, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let cases = [
        ("ROLLBACK", false, 0),
        ("ROLLBACK", true, 0),
        ("COMMIT", false, 1),
        ("COMMIT", true, 2),
    ];
    for (end, fail, ledger) in cases {
        let key = uuid::Uuid::new_v4().to_string();
        let entry = format!("{end}-{fail}");
        let error = end_the_transaction(key.clone(), entry, end.into(), fail)
            .id(&key)
            .on(&keiro)
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, keiro::Error::Failed { .. }),
            "{end} {fail}: {text}"
        );
        assert!(
            text.contains(&format!(
                "transactional step `end_it_myself` (#0) of workflow `end_the_transaction` id \
                 `{key}`"
            )) && text.contains(expected_end(backend, end)),
            "{text}"
        );
        assert_eq!(count(&key, "end_it_myself"), 1, "{end} {fail}: ran again");
        let steps = keiro.steps(&key).await.unwrap();
        assert!(steps.is_empty(), "{end} {fail}: journaled {steps:?}");
        let handle = keiro.handle::<Result<u32, String>>(&key).await.unwrap();
        assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Failed);
        assert_eq!(bank(store).await, (100, ledger), "{end} {fail}");
    }
    // The connections went back to the pool in order: a step runs on.
    let key = uuid::Uuid::new_v4().to_string();
    for _ in 0..3 {
        let out = pay(key.clone(), uuid::Uuid::new_v4().to_string(), 1)
            .on(&keiro)
            .await
            .unwrap();
        assert!(out.is_ok(), "{out:?}");
    }
    assert_eq!(bank(store).await, (97, 5));
}

/// Inserts ledger entry `entry` twice, swallows the second insert's error
/// (the primary key), and returns `Ok`.
#[step(transaction)]
async fn swallow_an_error(
    tx: &mut keiro::Transaction<'_>,
    key: String,
    entry: String,
) -> Result<u32, String> {
    ran(&key, "swallow_an_error");
    let mut db = tx.postgres().expect("PostgreSQL");
    let insert = "INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, 1)";
    for _ in 0..2 {
        let _ = sqlx::query(insert).bind(&entry).execute(&mut db).await;
    }
    Ok(2)
}

#[workflow]
async fn swallow_and_succeed(key: String, entry: String) -> Result<u32, String> {
    swallow_an_error(key, entry).await
}

/// Inserts ledger entry `entry`, commits keiro's transaction itself, then
/// runs a statement through the watched connection that fails with a
/// serialization failure (SQLSTATE 40001, raised by hand), and returns
/// `Ok`.
#[step(transaction)]
async fn commit_then_conflict(
    tx: &mut keiro::Transaction<'_>,
    key: String,
    entry: String,
) -> Result<u32, String> {
    ran(&key, "commit_then_conflict");
    let mut db = tx.postgres().expect("PostgreSQL");
    sqlx::query("INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, 1)")
        .bind(&entry)
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query("COMMIT")
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    let conflict =
        sqlx::query("DO $$ BEGIN RAISE EXCEPTION 'made up' USING ERRCODE = '40001'; END $$")
            .execute(&mut db)
            .await;
    assert!(conflict.is_err(), "the made-up conflict was raised");
    Ok(1)
}

#[workflow]
async fn commit_and_conflict(key: String, entry: String) -> Result<u32, String> {
    commit_then_conflict(key, entry).await
}

/// Each attempt's first run meets a serialization failure (raised by hand)
/// and its rerun returns `Err`, until the 55th attempt returns `Ok`: 54
/// conflicts in all, never two in a row.
#[step(transaction, max_attempts = 60, backoff_ms = 0)]
async fn conflict_then_fail(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    let run = count(&key, "conflict_then_fail") as u32;
    ran(&key, "conflict_then_fail");
    if run >= 108 {
        return Ok(run);
    }
    if run % 2 == 1 {
        return Err("an ordinary failure".into());
    }
    let mut db = tx.postgres().expect("PostgreSQL");
    sqlx::query("DO $$ BEGIN RAISE EXCEPTION 'made up' USING ERRCODE = '40001'; END $$")
        .execute(&mut db)
        .await
        .map(|_| 0)
        .map_err(|e| e.to_string())
}

#[workflow]
async fn alternates(key: String) -> Result<u32, String> {
    conflict_then_fail(key).await
}

/// The limit of 50 conflicts counts conflicts in a row: attempts that each
/// meet one conflict, then fail otherwise, go on past 50 conflicts in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_conflict_limit_counts_conflicts_in_a_row() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        alternates(key.clone()).id(&key).on(&keiro),
    )
    .await
    .expect("the step ends in time")
    .unwrap();
    assert_eq!(out, Ok(108));
}

/// Sends instance `key` a message in its transaction.
#[step(transaction)]
async fn send_one(tx: &mut keiro::Transaction<'_>, key: String) -> Result<(), String> {
    keiro::send_tx(tx, &key, "one", &1u32)
        .await
        .map_err(|e| e.to_string())
}

/// How many transactions on the database at `url` a transactional step's
/// commit left open and empty for the next one (its last statement ends
/// with the `COMMIT; BEGIN` keiro sends).
#[step]
async fn kept_transactions(url: String) -> Result<i64, String> {
    use sqlx::Connection as _;
    let mut observer = sqlx::PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND state = 'idle in transaction' AND query LIKE '%COMMIT; BEGIN'",
    )
    .fetch_one(&mut observer)
    .await
    .map_err(|e| e.to_string())
}

#[workflow]
async fn commits_then_looks(key: String, url: String) -> Result<i64, String> {
    send_one(key).await?;
    kept_transactions(url).await
}

/// A transactional step's commit leaves its connection in an open, empty
/// transaction for the next one, but not on a pool of one connection, where
/// it would hold up every other write until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_pool_of_one_keeps_no_transaction_for_the_next_step() {
    let looks = |keiro: Keiro, url: String| async move {
        let key = uuid::Uuid::new_v4().to_string();
        commits_then_looks(key.clone(), url)
            .id(&key)
            .on(&keiro)
            .await
            .unwrap()
            .unwrap()
    };
    // The probe sees the kept transaction where one is kept (for 50 ms: on
    // a slow machine its connect may come too late, so up to three tries).
    let db = TestDb::new(Backend::Postgres).await;
    let pooled = db.keiro().await;
    let mut seen = 0;
    for _ in 0..3 {
        seen = looks(pooled.clone(), db.url.clone()).await;
        if seen == 1 {
            break;
        }
    }
    assert_eq!(seen, 1, "a pool of eight keeps one");
    // A database of its own: nothing the first pool kept is counted.
    let db = TestDb::new(Backend::Postgres).await;
    let alone = db.builder().max_connections(1).connect().await.unwrap();
    assert_eq!(
        looks(alone, db.url.clone()).await,
        0,
        "a pool of one keeps none"
    );
}

/// A conflict normally runs the body again. Not after the body committed
/// keiro's transaction itself: its writes would apply twice. The instance
/// fails with `TransactionEnded`, and the body ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_conflict_after_the_body_committed_does_not_run_it_again() {
    let (_db, keiro) = bank_on(Backend::Postgres, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let error = commit_and_conflict(key.clone(), "committed".into())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(matches!(error, keiro::Error::Failed { .. }), "{error}");
    assert!(error.to_string().contains("COMMIT or ROLLBACK"), "{error}");
    assert_eq!(count(&key, "commit_then_conflict"), 1, "ran again");
    assert!(keiro.steps(&key).await.unwrap().is_empty());
    assert_eq!(bank(store).await, (100, 1), "the body's own commit");
}

/// Fails its first attempt at once (so a sleep racing it journals its
/// deadline meanwhile); its second writes a ledger entry, holds the write
/// lock 1.5 s, then commits keiro's transaction itself and returns `Ok`.
#[step(transaction, max_attempts = 2, backoff_ms = 50)]
async fn commit_late_myself(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    ran(&key, "commit_late_myself");
    if count(&key, "commit_late_myself") == 1 {
        return Err("the first attempt fails".into());
    }
    let c: &mut sqlx::SqliteConnection = tx.as_sqlite().expect("SQLite");
    sqlx::query("INSERT INTO tx_ledger (entry, account, cents) VALUES ('late', 1, 1)")
        .execute(&mut *c)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query("COMMIT")
        .execute(&mut *c)
        .await
        .map_err(|e| e.to_string())?;
    Ok(1)
}

#[workflow]
async fn sleep_beats_a_self_commit(key: String) -> Result<u32, String> {
    keiro::select! {
        _ = keiro::sleep(Duration::from_millis(300)) => Ok(0),
        done = commit_late_myself(key) => done,
    }
}

/// A body that commits keiro's transaction itself is caught also when its
/// branch of a select lost meanwhile (on SQLite the decision waits for the
/// lock the body holds, so the body returns while it is written): its
/// writes stay committed, so the instance fails with `TransactionEnded`
/// instead of going on as if the step had never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_losing_body_that_committed_itself_fails_the_instance() {
    let (_db, keiro) = bank_on(Backend::Sqlite, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let error = tokio::time::timeout(
        Duration::from_secs(30),
        sleep_beats_a_self_commit(key.clone()).id(&key).on(&keiro),
    )
    .await
    .expect("the run ends in time")
    .unwrap_err();
    assert!(error.to_string().contains("COMMIT or ROLLBACK"), "{error}");
    assert_eq!(bank(store).await, (100, 1), "the body's own commit");
}

/// Its first run writes a row whose deferred trigger fails the COMMIT with
/// a serialization failure (after the step claimed the select's win); every
/// later run fails with an `Err`, retried after a second.
#[step(transaction, max_attempts = 3, backoff_ms = 1000)]
async fn claims_then_fails(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    ran(&key, "claims_then_fails");
    if count(&key, "claims_then_fails") > 1 {
        return Err("this attempt fails".into());
    }
    let mut db = tx.postgres().expect("PostgreSQL");
    sqlx::query("INSERT INTO fails_at_commit (k) VALUES ($1)")
        .bind(&key)
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    Ok(0)
}

/// Sends instance `key` a message after 400 ms; returns `Ok(1)`.
#[step(transaction)]
async fn wins_later(tx: &mut keiro::Transaction<'_>, key: String) -> Result<u32, String> {
    tokio::time::sleep(Duration::from_millis(400)).await;
    keiro::send_tx(tx, &key, "won", &1u32)
        .await
        .map_err(|e| e.to_string())?;
    Ok(1)
}

#[workflow]
async fn a_claim_given_back(key: String) -> Result<u32, String> {
    keiro::select! {
        first = claims_then_fails(key.clone()) => first,
        later = wins_later(key) => later,
    }
}

/// A transactional step that claimed a select's win, met a conflict at its
/// commit and then failed an attempt gives the win back while it waits to
/// retry: another transactional branch finishing meanwhile wins and
/// commits, instead of waiting out the retries and losing to their `Err`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_claimed_win_goes_back_while_the_claimer_waits_to_retry() {
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = db.keiro().await;
    let keiro_store::Store::Postgres(pg) = keiro::unstable::raw_store(&keiro) else {
        unreachable!("PostgreSQL");
    };
    for ddl in [
        "CREATE TABLE fails_at_commit (k TEXT)",
        "CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'fails at commit' USING ERRCODE = '40001'; END $$",
        "CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON fails_at_commit \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_at_commit()",
    ] {
        sqlx::query(ddl).execute(pg.pool()).await.unwrap();
    }
    let key = uuid::Uuid::new_v4().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        a_claim_given_back(key.clone()).id(&key).on(&keiro),
    )
    .await
    .expect("the select decides in time")
    .unwrap();
    assert_eq!(out, Ok(1), "the later branch won");
    assert!(
        count(&key, "claims_then_fails") >= 2,
        "its commit conflicted"
    );
    let store = keiro::unstable::raw_store(&keiro);
    assert_eq!(store.count_waiting_messages(&key, "won").await.unwrap(), 1);
}

/// PostgreSQL aborts a transaction at its first failed statement. A body
/// that swallows that error and returns `Ok` cannot commit: the run stops
/// with an error that names the step and says what happened and what to
/// do, instead of the database's bare "current transaction is aborted";
/// nothing is journaled and none of the body's writes stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_body_that_swallows_a_failed_statement_is_told_so() {
    let (_db, keiro) = bank_on(Backend::Postgres, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let error = swallow_and_succeed(key.clone(), "swallowed".into())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "transactional step `swallow_an_error` (#0) of workflow `swallow_and_succeed` id \
             `{key}`"
        )) && text.contains("returned Ok after one of its statements failed")
            && text.contains("duplicate key"),
        "{text}"
    );
    assert_eq!(count(&key, "swallow_an_error"), 1, "ran again at once");
    let steps = keiro.steps(&key).await.unwrap();
    assert!(steps.is_empty(), "journaled {steps:?}");
    assert_eq!(bank(store).await, (100, 0), "the body's writes stayed");
}

/// Inserts ledger entry `entry` on the watched connection. On its first run
/// the insert is interrupted (a progress handler refusing to go on, once),
/// which makes SQLite roll the whole transaction back by itself, as it may
/// on a full disk or an I/O error. Then, if `go_on`, it inserts
/// `{entry}-after` (in autocommit: the transaction is gone) and runs one
/// more statement that is interrupted too, before it returns the first
/// interrupt's error.
#[step(transaction, max_attempts = 2, backoff_ms = 1)]
async fn interrupted_once(
    tx: &mut keiro::Transaction<'_>,
    key: String,
    entry: String,
    go_on: bool,
) -> Result<u32, String> {
    let first = count(&key, "interrupted_once") == 0;
    ran(&key, "interrupted_once");
    // Armed: the handler refuses its next call (and disarms).
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(first));
    if first {
        let c: &mut sqlx::SqliteConnection = tx.as_sqlite().expect("SQLite");
        let refuse = armed.clone();
        c.lock_handle()
            .await
            .map_err(|e| e.to_string())?
            .set_progress_handler(1, move || !refuse.swap(false, Ordering::SeqCst));
    }
    let insert = "INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, 1)";
    let mut db = tx.sqlite().expect("SQLite");
    let done = sqlx::query(insert).bind(&entry).execute(&mut db).await;
    if done.is_err() && go_on {
        sqlx::query(insert)
            .bind(format!("{entry}-after"))
            .execute(&mut db)
            .await
            .map_err(|e| e.to_string())?;
        armed.store(true, Ordering::SeqCst);
        let again = sqlx::query(insert)
            .bind(format!("{entry}-again"))
            .execute(&mut db)
            .await;
        assert!(again.is_err(), "the second interrupt");
    }
    done.map(|_| 1).map_err(|e| e.to_string())
}

#[workflow]
async fn survive_an_interrupt(key: String, entry: String, go_on: bool) -> Result<u32, String> {
    interrupted_once(key, entry, go_on).await
}

/// SQLite rolls a transaction back by itself when some statements fail (an
/// interrupt, a full disk, an I/O error). That is not the body ending the
/// transaction: when the body's last statement met such an error, its `Err`
/// is the attempt's outcome, nothing committed, and the step is retried per
/// `max_attempts`, the retry committing once. (A `ROLLBACK` of the body's
/// own fails the instance instead: see
/// `a_body_that_ends_the_transaction_itself_fails_the_instance`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_transaction_sqlite_rolled_back_itself_is_retried() {
    let (_db, keiro) = bank_on(Backend::Sqlite, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let out = survive_an_interrupt(key.clone(), "interrupted".into(), false)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok(1));
    assert_eq!(count(&key, "interrupted_once"), 2);
    assert_eq!(bank(store).await, (100, 1), "the retry's insert, once");
    let steps = keiro.steps(&key).await.unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].outcome, StepOutcome::Ok, "{steps:?}");
    assert_eq!(steps[0].attempts, Some(2), "{steps:?}");
}

/// The same rollback, but the body then writes again before it returns the
/// error: that write committed on its own (the transaction was gone), so
/// running the body again would apply it twice. The instance fails instead,
/// saying the transaction was rolled back under the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_body_that_goes_on_after_sqlites_rollback_is_not_run_again() {
    let (_db, keiro) = bank_on(Backend::Sqlite, 100).await;
    let store = keiro::unstable::raw_store(&keiro);
    let key = uuid::Uuid::new_v4().to_string();
    let error = survive_an_interrupt(key.clone(), "went-on".into(), true)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap_err();
    assert!(
        matches!(error, keiro::Error::Failed { .. })
            && error.to_string().contains("rolled back under its body"),
        "{error}"
    );
    assert_eq!(count(&key, "interrupted_once"), 1, "ran again");
    assert_eq!(
        bank(store).await,
        (100, 1),
        "the write after the rollback, once"
    );
    assert!(keiro.steps(&key).await.unwrap().is_empty());
}

/// Inserts `k` into `kept_rows`, then fails when `fail` says so (its insert
/// rolls back).
#[step(transaction, max_attempts = 1)]
async fn put_row(tx: &mut keiro::Transaction<'_>, k: String, fail: bool) -> Result<(), String> {
    let insert = "INSERT INTO kept_rows (k) VALUES ($1)";
    let done = if let Some(mut db) = tx.sqlite() {
        sqlx::query(insert)
            .bind(&k)
            .execute(&mut db)
            .await
            .map(drop)
    } else if let Some(mut db) = tx.postgres() {
        sqlx::query(insert)
            .bind(&k)
            .execute(&mut db)
            .await
            .map(drop)
    } else {
        unreachable!("keiro runs on SQLite or PostgreSQL")
    };
    done.map_err(|e| e.to_string())?;
    if fail {
        return Err(format!("{k} fails"));
    }
    Ok(())
}

/// Three transactional steps back to back, the second failing: each runs
/// on the connection the one before kept, when it committed.
#[workflow]
async fn put_three(key: String) -> Result<String, String> {
    put_row(format!("{key}-1"), false).await?;
    let second = put_row(format!("{key}-2"), true).await;
    put_row(format!("{key}-3"), false).await?;
    put_row(format!("{key}-4"), false).await?;
    Ok(format!("{second:?}"))
}

/// Creates the table `put_row` inserts into.
async fn create_kept_rows(store: &keiro_store::Store) {
    let create = "CREATE TABLE kept_rows (k TEXT PRIMARY KEY)";
    match store {
        keiro_store::Store::Sqlite(s) => sqlx::query(create).execute(s.pool()).await.map(drop),
        keiro_store::Store::Postgres(s) => sqlx::query(create).execute(s.pool()).await.map(drop),
    }
    .unwrap();
}

/// The keys in `kept_rows` that begin with `key`, in order.
async fn kept_rows(store: &keiro_store::Store, key: &str) -> Vec<String> {
    let select = "SELECT k FROM kept_rows WHERE k LIKE $1 ORDER BY k";
    let like = format!("{key}-%");
    match store {
        keiro_store::Store::Sqlite(s) => sqlx::query_scalar(select)
            .bind(like)
            .fetch_all(s.pool())
            .await
            .unwrap(),
        keiro_store::Store::Postgres(s) => sqlx::query_scalar(select)
            .bind(like)
            .fetch_all(s.pool())
            .await
            .unwrap(),
    }
}

/// A step that begins on the connection the step before kept after its
/// commit runs in a transaction of its own: its `Err` rolls back its own
/// insert and nothing of the steps before, and the steps after it commit.
async fn a_step_on_the_kept_connection_runs_in_a_transaction_of_its_own(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro);
    create_kept_rows(store).await;
    let key = uuid::Uuid::new_v4().to_string();
    let out = put_three(key.clone()).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(format!("Err(\"{key}-2 fails\")")));
    assert_eq!(
        kept_rows(store, &key).await,
        [format!("{key}-1"), format!("{key}-3"), format!("{key}-4")],
        "the failed step's insert rolled back, and only it"
    );
    assert_eq!(keiro.steps(&key).await.unwrap().len(), 4);
}

/// A connection of the test's own to the SQLite database, which never
/// waits for a lock (see `write_elsewhere`).
static ELSEWHERE: tokio::sync::Mutex<Option<sqlx::SqliteConnection>> =
    tokio::sync::Mutex::const_new(None);

/// Inserts `k` into `kept_rows` on [`ELSEWHERE`], refused if another
/// connection holds the write lock for more than 20 ms.
#[step]
async fn write_elsewhere(k: String) -> Result<(), String> {
    use sqlx::Connection as _;
    let mut conn = ELSEWHERE.lock().await;
    let conn = conn.as_mut().expect("ELSEWHERE is connected");
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| format!("the write lock was held: {e}"))?;
    sqlx::query("INSERT INTO kept_rows (k) VALUES ($1)")
        .bind(&k)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

/// A transactional step, then a write on another connection right after
/// it (while the step's connection is kept for the next), then another
/// transactional step.
#[workflow]
async fn put_then_write_elsewhere(key: String) -> Result<(), String> {
    put_row(format!("{key}-1"), false).await?;
    let elsewhere = write_elsewhere(format!("{key}-2")).await;
    put_row(format!("{key}-3"), false).await?;
    elsewhere
}

/// The tag of the SQLite connection the step runs on: a row of the
/// connection's own temporary table, made by the first step on it.
#[step(transaction)]
async fn connection_tag(tx: &mut keiro::Transaction<'_>) -> Result<String, String> {
    let mut db = tx.sqlite().expect("SQLite");
    let fresh = uuid::Uuid::new_v4().to_string();
    sqlx::query("CREATE TEMP TABLE IF NOT EXISTS test_conn_tag (tag TEXT NOT NULL)")
        .execute(&mut db)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query(
        "INSERT INTO test_conn_tag (tag) SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM test_conn_tag)",
    )
    .bind(&fresh)
    .execute(&mut db)
    .await
    .map_err(|e| e.to_string())?;
    sqlx::query_scalar("SELECT tag FROM test_conn_tag")
        .fetch_one(&mut db)
        .await
        .map_err(|e| e.to_string())
}

#[workflow]
async fn tag_three() -> Result<Vec<String>, String> {
    let mut tags = Vec::new();
    for _ in 0..3 {
        tags.push(connection_tag().await?);
    }
    Ok(tags)
}

/// SQLite: consecutive transactional steps run on the connection the first
/// kept (each in a transaction of its own: see
/// `a_step_on_the_kept_connection_runs_in_a_transaction_of_its_own`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_consecutive_transactional_steps_share_the_kept_connection() {
    let db = TestDb::new(Backend::Sqlite).await;
    let keiro = db.keiro().await;
    for round in 0..2 {
        let key = uuid::Uuid::new_v4().to_string();
        let tags = tag_three().id(&key).on(&keiro).await.unwrap().unwrap();
        assert!(
            tags.iter().all(|tag| *tag == tags[0]),
            "round {round}: the steps ran on other connections: {tags:?}"
        );
    }
}

/// SQLite: the connection a transactional step keeps for the next one
/// holds no lock: right after the step, another connection takes the write
/// lock without waiting, and the kept one goes back to the pool shortly
/// after the last step; closing the store does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_connection_kept_for_the_next_step_holds_no_lock() {
    use sqlx::ConnectOptions as _;
    let db = TestDb::new(Backend::Sqlite).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro).clone();
    create_kept_rows(&store).await;
    let keiro_store::Store::Sqlite(sqlite) = &store else {
        panic!("a SQLite store")
    };
    let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&db.url)
        .unwrap()
        // Long enough for a lone write of keiro's own (a heartbeat), short of
        // the 50 ms a transaction kept holding the lock would hold it.
        .busy_timeout(Duration::from_millis(20));
    *ELSEWHERE.lock().await = Some(options.connect().await.unwrap());
    for round in 0..2 {
        let key = uuid::Uuid::new_v4().to_string();
        let out = put_then_write_elsewhere(key.clone())
            .id(&key)
            .on(&keiro)
            .await
            .unwrap();
        assert_eq!(out, Ok(()), "round {round}");
        assert_eq!(
            kept_rows(&store, &key).await,
            [format!("{key}-1"), format!("{key}-2"), format!("{key}-3")]
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sqlite.pool().num_idle() != sqlite.pool().size() as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: {} of {} pooled connections idle 10 s after the last step",
                sqlite.pool().num_idle(),
                sqlite.pool().size()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let key = uuid::Uuid::new_v4().to_string();
    put_three(key.clone())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), store.close())
        .await
        .expect("closing the store waited for the kept transaction");
}

/// SQLite: a step whose begin on the kept connection meets the write lock
/// held elsewhere past that connection's busy timeout fails, naming the
/// lock, and leaves nothing broken: the lock is free once the other
/// writer lets go, and the next steps begin, write and commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_kept_connection_that_cannot_begin_fails_and_breaks_nothing() {
    use sqlx::ConnectOptions as _;
    let db = TestDb::new(Backend::Sqlite).await;
    let keiro = db.keiro().await;
    let store = keiro::unstable::raw_store(&keiro).clone();
    create_kept_rows(&store).await;
    let key = uuid::Uuid::new_v4().to_string();
    store
        .create_instance(&keiro_store::NewInstance::new(&key, "kept", "[]"))
        .await
        .unwrap();
    let timing = keiro_store::StepTiming {
        attempts: Some(1),
        started_at: None,
    };
    // Step `seq` of the instance: sets its connection's wait for the write
    // lock to `wait_ms` (for the next begin on it), inserts `{key}-{seq}`
    // and commits with its journal row, keeping its connection.
    let put = |seq: i64, wait_ms: u32| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            let mut tx = store.begin_step_tx().await?;
            let keiro_store::StepTx::Sqlite(conn) = &mut tx else {
                panic!("a SQLite transaction")
            };
            sqlx::query(&format!("PRAGMA busy_timeout = {wait_ms}"))
                .execute(&mut **conn)
                .await
                .unwrap();
            sqlx::query("INSERT INTO kept_rows (k) VALUES ($1)")
                .bind(format!("{key}-{seq}"))
                .execute(&mut **conn)
                .await
                .unwrap();
            let row = StepRow {
                workflow_id: key.clone(),
                generation: 0,
                seq,
                name: "put".into(),
                kind: "step".into(),
                result: "null".into(),
            };
            let now = store.now_us();
            tx.journal_and_commit(&store, row, timing, now).await
        }
    };
    assert!(put(1, 500).await.unwrap());
    let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&db.url)
        .unwrap()
        .busy_timeout(Duration::from_secs(5));
    let mut elsewhere = options.connect().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut elsewhere)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let error = put(2, 30_000)
        .await
        .expect_err("the write lock is held elsewhere");
    assert!(error.to_string().contains("locked"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        started.elapsed()
    );
    sqlx::query("COMMIT").execute(&mut elsewhere).await.unwrap();
    for seq in 3..=6 {
        assert!(put(seq, 30_000).await.unwrap(), "step {seq}");
    }
    // Another connection writes at once: nothing kept holds the lock.
    sqlx::query("PRAGMA busy_timeout = 0")
        .execute(&mut elsewhere)
        .await
        .unwrap();
    sqlx::query("INSERT INTO kept_rows (k) VALUES ($1)")
        .bind(format!("{key}-7"))
        .execute(&mut elsewhere)
        .await
        .unwrap();
    let expected: Vec<String> = [1, 3, 4, 5, 6, 7]
        .iter()
        .map(|n| format!("{key}-{n}"))
        .collect();
    assert_eq!(kept_rows(&store, &key).await, expected);
    let steps = store.load_journal(&key, 0).await.unwrap();
    let seqs: Vec<i64> = steps.iter().map(|step| step.seq).collect();
    assert_eq!(seqs, [1, 3, 4, 5, 6]);
}

/// Fails its first attempt at once (so the select's sleep journals its
/// deadline meanwhile); its second writes, then holds its transaction (on
/// SQLite the write lock) for 1.5 s.
#[step(transaction, max_attempts = 2, backoff_ms = 50)]
async fn late_loser(tx: &mut keiro::Transaction<'_>, key: String) -> Result<String, String> {
    ran(&key, "late_loser");
    if count(&key, "late_loser") == 1 {
        return Err("the first attempt fails".into());
    }
    keiro::send_tx(tx, &key, "held", &1u32)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(key)
}

#[workflow]
async fn sleep_beats_a_transaction(key: String) -> bool {
    keiro::select! {
        _ = keiro::sleep(Duration::from_millis(300)) => false,
        held = late_loser(key) => held.is_ok(),
    }
}

/// A sleep wins a select while a transactional step in the other branch
/// holds its transaction: the select's decision is written while that
/// branch is polled to its end, instead of waiting (on SQLite, for the
/// write lock the unpolled branch holds: the busy timeout, then an error),
/// and the losing step's writes roll back: neither its message nor its
/// journal row is left.
async fn a_transactional_step_losing_a_select_lets_the_decision_through(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = format!("loser-{backend:?}");
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        sleep_beats_a_transaction(key.clone())
            .id(key.clone())
            .on(&keiro),
    )
    .await
    .expect("the select decided in time")
    .unwrap();
    assert!(!out, "the sleep won");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(count(&key, "late_loser"), 2, "its second attempt ran");
    let store = keiro::unstable::raw_store(&keiro);
    let sent = store.count_waiting_messages(&key, "held").await.unwrap();
    assert_eq!(sent, 0, "the losing step's message rolled back");
    let names: Vec<String> = store
        .load_journal(&key, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|step| step.name)
        .collect();
    assert!(!names.contains(&"late_loser".to_string()), "{names:?}");
    drop(db);
}

on_both_backends!(
    a_transactional_branch_that_lost_elsewhere_rolls_its_writes_back,
    a_step_on_the_kept_connection_runs_in_a_transaction_of_its_own,
    a_transactional_step_losing_a_select_lets_the_decision_through,
    a_body_that_ends_the_transaction_itself_fails_the_instance,
    writes_and_result_commit_together_and_replay_skips_the_body,
    an_err_rolls_the_writes_back_and_is_journaled,
    failed_attempts_roll_back_and_the_retry_commits,
    an_attempt_out_of_time_rolls_back,
    a_step_journaled_elsewhere_first_keeps_that_result,
    awkward_text_is_journaled_exactly,
    concurrent_debits_of_one_account_are_exact,
    more_concurrent_debits_than_connections_all_finish,
    serializable_conflicts_are_retried,
    a_body_holding_sqlites_write_lock_long_is_warned_about,
    a_body_still_holding_its_transaction_is_warned_about_while_it_runs,
    a_body_outlasting_a_lease_renewal_finishes_once,
    a_transactional_step_inside_anothers_body_is_refused,
    a_transactional_step_inside_a_plain_steps_body_is_refused,
    a_transactional_step_running_at_the_deadline_rolls_back,
    a_workflow_awaited_in_a_steps_body_runs_its_transactional_steps,
    a_body_error_other_than_a_conflict_is_journaled_at_once,
);
