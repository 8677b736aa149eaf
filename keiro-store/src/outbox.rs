//! The outbox: a message, a new instance or an awakeable's answer written in
//! the caller's own transaction ([`TimerTx`]), so it exists exactly when the
//! caller's state change commits with it.
//!
//! Each operation is the one its pool-based twin runs ([`Store::send_message`],
//! [`Store::create_instance`], [`Store::resolve`]), on the caller's
//! transaction instead of one of its own. On PostgreSQL the wake
//! notification is sent in the same transaction (`pg_notify`), which
//! PostgreSQL delivers at commit and drops on rollback. SQLite has no such
//! hook: workers and waiters find the write by polling (the resume worker's
//! poll interval; a receiver waiting in memory looks every few milliseconds).
//!
//! [`Store::send_message`]: crate::Store::send_message
//! [`Store::create_instance`]: crate::Store::create_instance
//! [`Store::resolve`]: crate::Store::resolve

use crate::journal::{create_instance_on, get_step_on, resolve_on};
use crate::messages::{send_message_on, validate_message};
use crate::validate::validate_id;
use crate::{
    Conn, InstanceRow, NewInstance, NewMessage, Resolution, Result, SendOutcome, StepRow, TimerTx,
};

impl<'c> TimerTx<'_, 'c> {
    /// The same transaction, borrowed again for one more operation.
    pub fn reborrow(&mut self) -> TimerTx<'_, 'c> {
        match self {
            #[cfg(feature = "sqlite")]
            TimerTx::Sqlite(tx) => TimerTx::Sqlite(tx),
            #[cfg(feature = "postgres")]
            TimerTx::Postgres(tx) => TimerTx::Postgres(tx),
        }
    }
}

/// Queues a message in the caller's transaction, like
/// [`Store::send_message`](crate::Store::send_message): it is sent when the
/// transaction commits, and not at all when it rolls back. `now` (µs since
/// the Unix epoch, by the caller's clock: [`Store::now_us`](crate::Store::now_us))
/// stamps it, and a suspended receiver is due then.
pub async fn send_message_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    message: &NewMessage<'_>,
    now: i64,
) -> Result<SendOutcome>
where
    'c: 't,
{
    validate_message(message)?;
    let mut tx = tx.into();
    let outcome = send_message_on(tx.reborrow().into(), message, now).await?;
    if let SendOutcome::Sent(_) = outcome {
        notify_on(tx.into(), message.workflow_id).await?;
    }
    Ok(outcome)
}

/// Records a new instance in the caller's transaction, or reads the existing
/// one with that id, like [`Store::create_instance`](crate::Store::create_instance),
/// created at `now` (µs since the Unix epoch, by the caller's clock:
/// [`Store::now_us`](crate::Store::now_us)).
pub async fn create_instance_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    new: &NewInstance<'_>,
    now: i64,
) -> Result<(InstanceRow, bool)>
where
    'c: 't,
{
    validate_id("workflow id", new.id)?;
    validate_id("workflow name", new.name)?;
    let mut tx = tx.into();
    let created = create_instance_on(tx.reborrow().into(), new, now).await?;
    if created.1 {
        notify_on(tx.into(), "").await?;
    }
    Ok(created)
}

/// Records an awaitable's resolution in the caller's transaction, like
/// [`Store::resolve`](crate::Store::resolve), at `now` (µs since the Unix
/// epoch, by the caller's clock): a suspended workflow is due then.
pub async fn resolve_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    created: i64,
    kind: &str,
    row: &StepRow,
    now: i64,
) -> Result<Resolution>
where
    'c: 't,
{
    let mut tx = tx.into();
    let resolution = resolve_on(tx.reborrow().into(), created, kind, row, now).await?;
    if resolution == Resolution::Recorded {
        notify_on(tx.into(), &row.workflow_id).await?;
    }
    Ok(resolution)
}

/// Reads one recorded step in the caller's transaction, like
/// [`Store::get_step`](crate::Store::get_step).
pub async fn get_step_tx<'t, 'c>(
    tx: impl Into<TimerTx<'t, 'c>>,
    id: &str,
    generation: i64,
    seq: i64,
) -> Result<Option<StepRow>>
where
    'c: 't,
{
    get_step_on(tx.into().into(), "get_step", id, generation, seq).await
}

/// Wakes the workers and waiters on instance `id` (empty: none in
/// particular) when `conn`'s transaction commits: PostgreSQL delivers a
/// `NOTIFY` then. Nothing on SQLite, whose workers poll.
pub(crate) async fn notify_on(conn: Conn<'_>, id: &str) -> Result<()> {
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(_) => {
            let _ = id;
            Ok(())
        }
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => {
            crate::prepared::query("SELECT pg_notify($1, $2)")
                .bind(crate::postgres::notify::WAKE_CHANNEL)
                .bind(crate::wake_payload(id).as_ref())
                .execute(c)
                .await
                .map_err(crate::StoreError::query("notify"))?;
            Ok(())
        }
    }
}
