//! A transactional step: the account's debit and the step's journal row
//! commit in one transaction on keiro's own database, so the debit happens
//! exactly once even if the process dies between the write and the commit.
//!
//! ```text
//! cargo run -p keiro-examples --example transactional_step   # debits account 1 by 250
//! cargo run -p keiro-examples --example transactional_step   # same payment id: replayed, no second debit
//! ```
//!
//! With no `KEIRO_DATABASE_URL` the accounts table lives beside keiro's
//! tables in `keiro.db`; on PostgreSQL the same code runs unchanged.

use keiro::{step, workflow, Transaction};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum BankError {
    #[error("account {0} has too little money")]
    Insufficient(i64),
    #[error("database: {0}")]
    Db(String),
}

impl From<sqlx::Error> for BankError {
    fn from(e: sqlx::Error) -> Self {
        BankError::Db(e.to_string())
    }
}

/// Runs one statement on whichever backend the transaction is on, returning
/// the `i64` it selects (both backends accept `$1`). A deadlock or
/// serialization failure it meets runs the step again.
async fn scalar(tx: &mut Transaction<'_>, sql: &str, a: i64, b: i64) -> Result<i64, BankError> {
    Ok(if let Some(mut db) = tx.sqlite() {
        sqlx::query_scalar(sql)
            .bind(a)
            .bind(b)
            .fetch_one(&mut db)
            .await?
    } else if let Some(mut db) = tx.postgres() {
        sqlx::query_scalar(sql)
            .bind(a)
            .bind(b)
            .fetch_one(&mut db)
            .await?
    } else {
        unreachable!("keiro runs on SQLite or PostgreSQL")
    })
}

/// Creates the table and account 1 with 1000 cents if missing. Called
/// outside a workflow, a transactional step just runs in a committed
/// transaction of the process-wide runtime.
#[step(transaction)]
async fn open_accounts(tx: &mut Transaction<'_>) -> Result<i64, BankError> {
    let create =
        "CREATE TABLE IF NOT EXISTS accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)";
    if let Some(mut db) = tx.sqlite() {
        sqlx::query(create).execute(&mut db).await?;
    } else if let Some(mut db) = tx.postgres() {
        sqlx::query(create).execute(&mut db).await?;
    }
    scalar(
        tx,
        "INSERT INTO accounts (id, balance) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET balance = accounts.balance RETURNING balance",
        1,
        1000,
    )
    .await
}

/// Takes `cents` from `account` and returns the new balance; an overdraft
/// is an `Err`, which rolls the update back.
#[step(transaction)]
async fn debit(tx: &mut Transaction<'_>, account: i64, cents: i64) -> Result<i64, BankError> {
    println!("  debiting {cents} from account {account}");
    let balance = scalar(
        tx,
        "UPDATE accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance",
        cents,
        account,
    )
    .await?;
    if balance < 0 {
        return Err(BankError::Insufficient(account));
    }
    Ok(balance)
}

#[workflow]
async fn pay(account: i64, cents: i64) -> Result<i64, BankError> {
    debit(account, cents).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let before = open_accounts().await?;
    println!("account 1 holds {before} cents");
    let after = pay(1, 250).id("payment-1").await??;
    println!("payment-1 done: account 1 holds {after} cents (run me again: no second debit)");
    Ok(())
}
