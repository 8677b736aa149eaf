//! Debounce (`WorkflowCall::debounce`): folding a burst of enqueues of one
//! workflow and key into one pending instance that starts after the burst.
//!
//! A burst is open while its instance is `pending` and unclaimed
//! (`lease_owner IS NULL`); a unique partial index holds at most one open
//! burst per workflow name and key. A debounced enqueue, in one transaction,
//! updates the open burst's instance (the new call's input, and a wake time
//! `delay` from now, capped at the burst's `debounce_until`), or, when there
//! is none, creates one. The ordinary claim starts it once it is due; once
//! claimed it leaves the index and the next call opens a new burst.
//!
//! Race freedom: on PostgreSQL the transaction first takes a
//! transaction-scoped advisory lock on the workflow name and key, so calls
//! of one burst from any number of processes run one after the other, each
//! reading what the previous committed. A claim that locked the row first
//! makes the update wait and then find the row claimed (so the call opens a
//! new burst); an update that locked it first makes the claim's
//! `SKIP LOCKED` pass it over until the next poll. On SQLite
//! `BEGIN IMMEDIATE` serialises writers already.

use crate::rows::FromRow;
use crate::sql::Dialect;
use crate::{Conn, InstanceRow, NewInstance, Queued, Result, Store, StoreError};

/// How a debounced call folds into its burst.
#[derive(Debug, Clone, Copy)]
pub struct Debounce<'a> {
    /// The calls of one workflow with this key form a burst.
    pub key: &'a str,
    /// The burst's instance is due this long (µs) after its latest call.
    pub delay_us: i64,
    /// And no later than this long (µs) after its first call; `None`: no
    /// bound. The tightest bound any call of the burst gave holds.
    pub max_wait_us: Option<i64>,
    /// When set, the instance's deadline is this long (µs) after the time
    /// the burst's instance is due (when it starts), whatever
    /// `NewInstance::deadline` says: a call's `.timeout(t)` gives `t` less
    /// the delay, so the deadline is `t` after the call when the instance
    /// starts at the call's own due time, and moves with the start when the
    /// burst starts later (an earlier call's longer delay, a call that
    /// waited for the burst's lock or read a clock behind). `None`: the
    /// call's own deadline (an absolute `.deadline(..)`, or none).
    pub deadline_after_start_us: Option<i64>,
}

/// Class `"keid"` in ASCII: bursts' advisory locks, apart from queues'.
const LOCK: &str = "SELECT pg_advisory_xact_lock(1801808228, hashtext($1))";

/// One backend's text of the debounce statements.
#[derive(Debug)]
pub(crate) struct DebounceStatements {
    /// Serialises one burst's calls across processes (PostgreSQL).
    lock: Option<&'static str>,
    extend: String,
    open: String,
    /// $1 name, $2 key, $3 a call's due time, $4 its `max_wait`: when the
    /// open burst would start with that call, if a burst is open.
    start: String,
}

/// The open burst's latest start, with a call whose `max_wait` is
/// `max_wait` (a placeholder): the tightest bound of its calls, each
/// counted from the burst's first call (its creation).
fn until(max_wait: &str) -> String {
    format!(
        "CASE WHEN {max_wait} IS NULL THEN debounce_until \
         WHEN debounce_until IS NULL OR debounce_until > created_at + {max_wait} \
         THEN created_at + {max_wait} ELSE debounce_until END"
    )
}

/// When the open burst starts with a call due at `due` whose `max_wait` is
/// `max_wait` (placeholders): the later of its due time and the call's (a
/// call never brings the start forward: one whose process reads an earlier
/// clock leaves the later due time), within the burst's bound.
fn start(due: &str, max_wait: &str) -> String {
    let later = format!("CASE WHEN wake_at > {due} THEN wake_at ELSE {due} END");
    let until = until(max_wait);
    format!(
        "CASE WHEN ({until}) IS NOT NULL AND ({until}) < ({later}) \
         THEN ({until}) ELSE ({later}) END"
    )
}

impl DebounceStatements {
    /// Spells the debounce statements in `d`'s dialect.
    pub(crate) fn new(d: &Dialect) -> DebounceStatements {
        let w = format!("{}workflows", d.tables);
        DebounceStatements {
            // Where queue claims need an advisory lock to be race-free, so
            // do bursts.
            lock: d.queue_lock.map(|_| LOCK),
            // $1 name, $2 key, $3 input, $4 signature, $5 deadline,
            // $6 traceparent, $7 app version, $8 skeleton hash, $9 queue,
            // $10 priority, $11 partition, $12 due (now + delay, or the due
            // time already set if later), $13 now, $14 the deadline's
            // distance from the start (see `Debounce`), $15 the call's
            // `max_wait`.
            extend: {
                let (until, start) = (until("$15"), start("$12", "$15"));
                // An absolute deadline ($5, with no $14) at or before the
                // start would end the instance before it ran: not applied,
                // and the caller refuses the call (see `burst_start`).
                format!(
                    "UPDATE {w} SET input = $3, signature = $4, \
                     deadline = CASE WHEN $14 IS NULL THEN $5 ELSE ({start}) + $14 END, \
                     traceparent = $6, app_version = $7, skeleton_hash = $8, queue = $9, \
                     priority = $10, partition_key = $11, debounce_until = {until}, \
                     wake_at = {start}, updated_at = $13 \
                     WHERE name = $1 AND debounce_key = $2 AND status = 'pending' \
                     AND lease_owner IS NULL \
                     AND ($14 IS NOT NULL OR $5 IS NULL OR $5 > ({start})) \
                     RETURNING {columns}",
                    columns = crate::sql::INSTANCE_COLUMNS,
                )
            },
            start: format!(
                "SELECT {start} FROM {w} WHERE name = $1 AND debounce_key = $2 \
                 AND status = 'pending' AND lease_owner IS NULL",
                start = start("$3", "$4"),
            ),
            // $1 id, $2 queue, $3 priority, $4 partition, $5 due, $6 key,
            // $7 the burst's latest start, $8 its place in line, $9 the
            // deadline's distance from the start.
            open: format!(
                "UPDATE {w} SET queue = $2, priority = $3, partition_key = $4, wake_at = $5, \
                 debounce_key = $6, debounce_until = $7, created_at = $8, \
                 deadline = CASE WHEN $9 IS NULL THEN deadline ELSE $5 + $9 END WHERE id = $1"
            ),
        }
    }
}

impl Store {
    /// Records a debounced call of `new.name`: updates the open burst of
    /// `debounce.key` to `new`'s input (and signature, deadline, trace,
    /// version and queue settings), due `debounce.delay_us` from now but no
    /// later than the burst's bound; or, when no burst is open, opens one
    /// with `new` (its id) on `queued`'s queue. Returns the burst's
    /// instance, and `true` when this call created it. `queued.dedup` and
    /// `queued.not_before` are ignored: the burst decides when it is due.
    pub async fn create_debounced(
        &self,
        new: &NewInstance<'_>,
        queued: &Queued<'_>,
        debounce: &Debounce<'_>,
    ) -> Result<(InstanceRow, bool)> {
        const OP: &str = "create_debounced";
        let clock = self.clock();
        // keiro's own transactions run at READ COMMITTED (see
        // `postgres::BEGIN`), so this one reads the burst as its last call
        // committed it, whatever the server's default isolation.
        dispatch!(Store, self, |s| {
            let mut tx = s.begin(OP).await?;
            let debounced =
                create_debounced_on((&mut *tx).into(), new, queued, debounce, clock).await?;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(debounced)
        })
    }
}

/// Records a debounced call in the caller's transaction, like
/// [`Store::create_debounced`] (the time read off `clock`, the store clock
/// of the caller's runtime). On PostgreSQL the burst's lock is held until
/// `tx` ends, and workers are notified at commit when the call opened a
/// burst. A transaction whose snapshot is older than its burst's last
/// change (PostgreSQL `REPEATABLE READ` or `SERIALIZABLE`, a deferred SQLite
/// transaction that read before it) is refused with
/// [`StoreError::BurstConflict`].
pub async fn create_debounced_tx<'t, 'c>(
    tx: impl Into<crate::TimerTx<'t, 'c>>,
    new: &NewInstance<'_>,
    queued: &Queued<'_>,
    debounce: &Debounce<'_>,
    clock: &crate::Clock,
) -> Result<(InstanceRow, bool)>
where
    'c: 't,
{
    let mut tx = tx.into();
    let debounced = create_debounced_on(tx.reborrow().into(), new, queued, debounce, clock).await?;
    if debounced.1 {
        crate::outbox::notify_on(tx.into(), "").await?;
    }
    Ok(debounced)
}

/// [`Store::create_debounced`] on `conn`, a transaction, at the time
/// `clock` reads once the burst is this call's alone: a call that waited
/// for another's counts from when it goes on, so the burst's start is never
/// less than its delay after the call that committed last. (PostgreSQL: the
/// burst's lock, taken here. SQLite: the write lock, which a transaction
/// begun with `BEGIN IMMEDIATE` holds from its start, as `enqueue_tx` asks
/// of its caller; a deferred one takes it only at its first write, after
/// the clock was read, and its extension is then only kept from moving the
/// start forward.)
async fn create_debounced_on(
    conn: Conn<'_>,
    new: &NewInstance<'_>,
    queued: &Queued<'_>,
    debounce: &Debounce<'_>,
    clock: &crate::Clock,
) -> Result<(InstanceRow, bool)> {
    crate::validate::validate_id("workflow id", new.id)?;
    crate::validate::validate_id("workflow name", new.name)?;
    crate::validate::validate_id("debounce key", debounce.key)?;
    fold_into_burst(conn, new, queued, debounce, clock)
        .await
        .map_err(|error| burst_conflict(error, new.name, debounce.key))
}

/// [`create_debounced_on`] once its names are checked.
async fn fold_into_burst(
    mut conn: Conn<'_>,
    new: &NewInstance<'_>,
    queued: &Queued<'_>,
    debounce: &Debounce<'_>,
    clock: &crate::Clock,
) -> Result<(InstanceRow, bool)> {
    const OP: &str = "create_debounced";
    dispatch!(Conn, conn.reborrow(), |c, sql| {
        if let Some(lock) = sql.debounce.lock {
            crate::prepared::query(lock)
                .bind(format!("{}\n{}", new.name, debounce.key))
                .execute(&mut *c)
                .await
                .map_err(StoreError::query(OP))?;
        }
        Ok::<_, StoreError>(())
    })?;
    let now = clock.now_us();
    let due = now.saturating_add(debounce.delay_us);
    let extend = args![
        new.name,
        debounce.key,
        new.input,
        new.signature,
        new.deadline,
        new.traceparent,
        new.app_version,
        new.skeleton_hash,
        queued.queue,
        queued.priority,
        queued.partition,
        due,
        now,
        debounce.deadline_after_start_us,
        debounce.max_wait_us,
    ];
    let extended = dispatch!(Conn, conn.reborrow(), |c, sql| {
        bind_all!(crate::prepared::query(&sql.debounce.extend), &extend)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query(OP))?
            .map(|row| InstanceRow::from_row(&row))
            .transpose()
    })?;
    if let Some(row) = extended {
        return Ok((row, false));
    }
    // An absolute deadline the extension refused, or a new burst's: not
    // after the instance's start, it would end the instance unrun.
    if let (None, Some(deadline)) = (debounce.deadline_after_start_us, new.deadline) {
        let start = match burst_start(conn.reborrow(), new.name, debounce, due).await? {
            Some(start) => start,
            None => due,
        };
        if deadline <= start {
            return Err(StoreError::DeadlineBeforeStart {
                name: new.name.to_owned(),
                key: debounce.key.to_owned(),
                deadline_us: deadline,
                start_us: start,
            });
        }
    }
    let (mut row, created) = crate::journal::create_instance_on(conn.reborrow(), new, now).await?;
    if created {
        let until = debounce.max_wait_us.map(|max| now.saturating_add(max));
        // A burst's instance takes its place in its queue when it opens.
        let created_at = clock.creation_stamps(1);
        let open = args![
            new.id,
            queued.queue,
            queued.priority,
            queued.partition,
            due,
            debounce.key,
            until,
            created_at,
            debounce.deadline_after_start_us,
        ];
        dispatch!(Conn, conn, |c, sql| {
            bind_all!(crate::prepared::query(&sql.debounce.open), &open)
                .execute(&mut *c)
                .await
                .map(|_| ())
                .map_err(StoreError::query(OP))
        })?;
        row.wake_at = Some(due);
        row.created_at = created_at;
    }
    Ok((row, created))
}

/// When the open burst of `name` and `debounce.key` would start with a call
/// due at `due`; `None` when no burst is open.
async fn burst_start(
    conn: Conn<'_>,
    name: &str,
    debounce: &Debounce<'_>,
    due: i64,
) -> Result<Option<i64>> {
    let args = args![name, debounce.key, due, debounce.max_wait_us];
    dispatch!(Conn, conn, |c, sql| {
        bind_all!(crate::prepared::query_scalar(&sql.debounce.start), &args)
            .fetch_optional(&mut *c)
            .await
            .map_err(StoreError::query("create_debounced"))
    })
}

/// `error` as [`StoreError::BurstConflict`] when it says the transaction
/// could not see its burst's current state: a serialization failure
/// (PostgreSQL `40001`: the burst's row changed after the snapshot), a stale
/// snapshot (SQLite `SQLITE_BUSY_SNAPSHOT`), or, on PostgreSQL, the open
/// burst index refusing a second burst that the snapshot hid the first of.
/// A deadlock or a plain busy database is left as it is.
fn burst_conflict(error: StoreError, name: &str, key: &str) -> StoreError {
    let StoreError::Query { source, .. } = &error else {
        return error;
    };
    let stale = matches!(&**source, sqlx::Error::Database(db)
        if (db.is_unique_violation()
            && db.constraint().is_some_and(|index| index.ends_with("debounce_open")))
            // 40001 on PostgreSQL; SQLITE_BUSY_SNAPSHOT (517) on SQLite.
            || matches!(db.code().as_deref(), Some("40001" | "517")));
    if !stale {
        return error;
    }
    StoreError::BurstConflict {
        name: name.to_owned(),
        key: key.to_owned(),
        source: source.clone(),
    }
}
