//! A small bank on keiro's own database, for the transactional-step tests
//! and their child process: accounts, a ledger with one row per debit, and
//! `#[step(transaction)]`s that write both with the step's result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use keiro::{step, workflow, Transaction};
use keiro_store::Store;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::ran;

/// Set in the child process of the crash test: a debit prints
/// `INSERTED <entry>` after its writes and then waits forever, before its
/// transaction commits.
pub static PAUSE_AFTER_INSERT: AtomicBool = AtomicBool::new(false);

/// Runs `$body` with `$c` bound to the connection inside `$tx` (a
/// `keiro::Transaction`), whichever backend it is on.
macro_rules! on_tx {
    ($tx:expr, |$c:ident| $body:expr) => {{
        if let Some(tx) = $tx.as_sqlite() {
            let $c: &mut sqlx::SqliteConnection = &mut **tx;
            $body
        } else {
            let tx = $tx
                .as_postgres()
                .expect("keiro runs on SQLite or PostgreSQL");
            let $c: &mut sqlx::PgConnection = &mut **tx;
            $body
        }
    }};
}

/// Runs `$body` with `$c` bound to a pool of `$store`'s database (on
/// PostgreSQL, a transaction of its own).
macro_rules! on_pool {
    ($store:expr, |$c:ident| $body:expr) => {{
        match $store {
            Store::Sqlite(s) => {
                let $c = s.pool();
                $body
            }
            // In a transaction, with unnamed statements: also right through
            // a transaction-pooling proxy.
            Store::Postgres(s) => {
                let mut tx = s.pool().begin().await.expect("begin");
                let out = {
                    let $c = &mut *tx;
                    $body
                };
                tx.commit().await.expect("commit");
                out
            }
        }
    }};
}

/// Why a debit failed; journaled like any step error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BankError {
    /// The balance would go below zero.
    Insufficient,
    /// The transaction lost a race with another one (retried).
    Conflict,
    /// Any other database error.
    Db(String),
}

impl From<sqlx::Error> for BankError {
    fn from(error: sqlx::Error) -> Self {
        if Transaction::is_conflict(&error) {
            BankError::Conflict
        } else {
            BankError::Db(error.to_string())
        }
    }
}

impl BankError {
    /// `retry_if` of the serializable debit: only conflicts are retried.
    pub fn is_conflict(&self) -> bool {
        *self == BankError::Conflict
    }
}

/// Creates the bank's tables in `store`'s database, with account `1`
/// holding `balance`.
pub async fn open_bank(store: &Store, balance: i64) {
    let statements = [
        "CREATE TABLE tx_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "CREATE TABLE tx_ledger (entry TEXT PRIMARY KEY, account BIGINT NOT NULL, \
         cents BIGINT NOT NULL)",
    ];
    for statement in statements {
        on_pool!(store, |pool| sqlx::query(statement)
            .persistent(false)
            .execute(pool)
            .await
            .map(drop))
        .expect("create the bank's tables");
    }
    let insert = "INSERT INTO tx_accounts (id, balance) VALUES (1, $1)";
    on_pool!(store, |pool| sqlx::query(insert)
        .persistent(false)
        .bind(balance)
        .execute(pool)
        .await
        .map(drop))
    .expect("open account 1");
}

/// Account 1's balance and the number of ledger rows.
pub async fn bank(store: &Store) -> (i64, i64) {
    let balance = "SELECT balance FROM tx_accounts WHERE id = 1";
    let rows = "SELECT COUNT(*) FROM tx_ledger";
    let balance: i64 = on_pool!(store, |pool| sqlx::query_scalar(balance)
        .persistent(false)
        .fetch_one(pool)
        .await)
    .expect("read the balance");
    let rows: i64 = on_pool!(store, |pool| sqlx::query_scalar(rows)
        .persistent(false)
        .fetch_one(pool)
        .await)
    .expect("count the ledger");
    (balance, rows)
}

/// The ledger insert and balance update of one debit; the new balance.
async fn write_debit(
    tx: &mut Transaction<'_>,
    entry: &str,
    cents: i64,
) -> Result<i64, sqlx::Error> {
    let insert = "INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, $2)";
    let update = "UPDATE tx_accounts SET balance = balance - $1 WHERE id = 1 RETURNING balance";
    on_tx!(tx, |c| {
        sqlx::query(insert)
            .persistent(false)
            .bind(entry)
            .bind(cents)
            .execute(&mut *c)
            .await?;
        sqlx::query_scalar(update)
            .persistent(false)
            .bind(cents)
            .fetch_one(c)
            .await
    })
}

/// Debits `cents` from account 1 under ledger entry `entry`: the new
/// balance, or `Insufficient` (the writes roll back).
#[step(transaction)]
pub async fn debit(
    tx: &mut Transaction<'_>,
    key: String,
    entry: String,
    cents: i64,
) -> Result<i64, BankError> {
    ran(&key, "debit");
    let balance = write_debit(tx, &entry, cents).await?;
    if PAUSE_AFTER_INSERT.load(Ordering::SeqCst) {
        println!("INSERTED {entry}");
        std::future::pending::<()>().await;
    }
    if balance < 0 {
        return Err(BankError::Insufficient);
    }
    Ok(balance)
}

/// Writes ledger entry `entry` (one cent) and returns the entry's text, so
/// the step's journaled result holds whatever characters `entry` does.
#[step(transaction)]
pub async fn echo_entry(
    tx: &mut Transaction<'_>,
    key: String,
    entry: String,
) -> Result<String, BankError> {
    ran(&key, "echo_entry");
    write_debit(tx, &entry, 1).await?;
    Ok(entry)
}

/// One [`echo_entry`].
#[workflow]
pub async fn echo(key: String, entry: String) -> Result<String, BankError> {
    echo_entry(key, entry).await
}

/// Like [`debit`], failing (after its writes) until its third attempt.
#[step(transaction, max_attempts = 3, backoff_ms = 1)]
pub async fn flaky_debit(
    tx: &mut Transaction<'_>,
    key: String,
    entry: String,
    cents: i64,
) -> Result<i64, BankError> {
    ran(&key, "flaky_debit");
    let balance = write_debit(tx, &entry, cents).await?;
    if crate::count(&key, "flaky_debit") < 3 {
        return Err(BankError::Db("flaky".into()));
    }
    Ok(balance)
}

/// Like [`debit`], but too slow: it runs out of time after its writes.
#[step(transaction, timeout_ms = 50)]
pub async fn slow_debit(
    tx: &mut Transaction<'_>,
    key: String,
    entry: String,
    cents: i64,
) -> Result<i64, String> {
    ran(&key, "slow_debit");
    debit_then_wait(tx, &entry, cents, std::time::Duration::from_secs(30)).await
}

/// Like [`debit`], then takes a second more before it returns `Ok`.
#[step(transaction)]
pub async fn late_debit(
    tx: &mut Transaction<'_>,
    key: String,
    entry: String,
    cents: i64,
) -> Result<i64, String> {
    ran(&key, "late_debit");
    debit_then_wait(tx, &entry, cents, std::time::Duration::from_secs(1)).await
}

/// [`write_debit`], then a wait of `pause` before the balance is returned.
async fn debit_then_wait(
    tx: &mut Transaction<'_>,
    entry: &str,
    cents: i64,
    pause: std::time::Duration,
) -> Result<i64, String> {
    let balance = write_debit(tx, entry, cents)
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(pause).await;
    Ok(balance)
}

/// A debit that reads the balance and writes the difference back, under
/// PostgreSQL's SERIALIZABLE isolation: concurrent ones conflict and are
/// retried.
#[step(transaction, max_attempts = 1000, backoff_ms = 1, retry_if = BankError::is_conflict)]
pub async fn serializable_debit(
    tx: &mut Transaction<'_>,
    key: String,
    entry: String,
    cents: i64,
) -> Result<i64, BankError> {
    ran(&key, "serializable_debit");
    let tx = tx.as_postgres().expect("a PostgreSQL test");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        .persistent(false)
        .execute(&mut **tx)
        .await?;
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM tx_accounts WHERE id = 1")
        .persistent(false)
        .fetch_one(&mut **tx)
        .await?;
    tokio::task::yield_now().await;
    sqlx::query("INSERT INTO tx_ledger (entry, account, cents) VALUES ($1, 1, $2)")
        .persistent(false)
        .bind(&entry)
        .bind(cents)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE tx_accounts SET balance = $1 WHERE id = 1")
        .persistent(false)
        .bind(balance - cents)
        .execute(&mut **tx)
        .await?;
    Ok(balance - cents)
}

/// A plain step, journaled through the group-commit writer.
#[step]
pub async fn note(key: String, n: u32) -> u32 {
    ran(&key, "note");
    wait_at_gate(&key).await;
    n + 1
}

/// A plain step (step 0), then one debit of `cents` under entry `entry`
/// (step 1).
#[workflow]
pub async fn pay(key: String, entry: String, cents: i64) -> Result<i64, BankError> {
    note(key.clone(), 0).await;
    debit(key, entry, cents).await
}

/// `debits` debits of one cent each (entries `{key}-{n}`), each after a
/// plain step, so the group-commit writer and the debits' transactions take
/// turns; the last balance.
#[workflow]
pub async fn pay_many(key: String, debits: u32, serializable: bool) -> Result<i64, BankError> {
    let mut balance = 0;
    for n in 0..debits {
        note(key.clone(), n).await;
        let entry = format!("{key}-{n}");
        balance = if serializable {
            serializable_debit(key.clone(), entry, 1).await?
        } else {
            debit(key.clone(), entry, 1).await?
        };
    }
    Ok(balance)
}

/// A debit that runs out of time.
#[workflow]
pub async fn pay_slowly(key: String, entry: String, cents: i64) -> Result<i64, String> {
    slow_debit(key, entry, cents).await
}

/// A debit retried until its third attempt.
#[workflow]
pub async fn pay_flaky(key: String, entry: String, cents: i64) -> Result<i64, BankError> {
    flaky_debit(key, entry, cents).await
}

/// Plain steps held at a gate of the tests: [`note`] waits there until the
/// test opens it.
fn gates() -> &'static Mutex<HashMap<String, Arc<Notify>>> {
    static GATES: std::sync::OnceLock<Mutex<HashMap<String, Arc<Notify>>>> =
        std::sync::OnceLock::new();
    GATES.get_or_init(Default::default)
}

/// Makes the next [`note`] under test key `key` wait at their gate; returns it (open it
/// with `notify_one`).
pub fn close_gate(key: &str) -> Arc<Notify> {
    let gate = Arc::new(Notify::new());
    gates().lock().unwrap().insert(key.to_owned(), gate.clone());
    gate
}

async fn wait_at_gate(key: &str) {
    let gate = gates().lock().unwrap().remove(key);
    if let Some(gate) = gate {
        ran(key, "at the gate");
        gate.notified().await;
    }
}
