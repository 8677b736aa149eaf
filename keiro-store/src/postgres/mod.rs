//! The PostgreSQL backend: many processes, one `keiro` schema.
//!
//! Every statement is written so that concurrent processes sharing the
//! database stay correct: conflicts are resolved by primary keys and
//! `ON CONFLICT DO NOTHING`, and lease checks sit in the `WHERE` clause of the
//! `UPDATE` that takes the lease, which PostgreSQL re-evaluates on the locked
//! row when two claims race.

mod exec;
mod failover;
pub(crate) mod journal;
mod messages;
mod migrate;
pub(crate) mod notify;
mod resume;
mod url;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres, Transaction};

pub(crate) use self::exec::{PgExec, PgSession};
use crate::error::redact;
use crate::sql::{Dialect, Statements};
use crate::{Result, StoreError, StoreOptions};

/// The PostgreSQL migrations, embedded at build time (made into a
/// migrator on first use).
///
/// [`PostgresStore::connect`] runs them with `search_path` set to `keiro`, so
/// sqlx's bookkeeping table is `keiro._sqlx_migrations` and never collides
/// with an application's own sqlx migrations in the same database.
pub static POSTGRES_MIGRATOR: LazyLock<sqlx::migrate::Migrator> =
    LazyLock::new(|| crate::migrations::migrator(crate::migrations::POSTGRES));

/// How PostgreSQL spells the shared statements.
const DIALECT: Dialect = Dialect {
    lock_row: " FOR UPDATE",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    json_param: "::json",
    json_object: "json_build_object",
    json_as_text: "::text",
    find_text: "strpos",
    timer_channel: Some(notify::TIMER_CHANNEL),
    modifying_ctes: true,
    wake_channel: Some(notify::WAKE_CHANNEL),
    // Class `"keiq"` in ASCII; the queue name's hash is the second key. For
    // the rest of the claim's transaction (which holds the queue's lock, so
    // every claim of the queue waits on it) its statements run on generic
    // plans: planning the recursive rooms statement afresh for each
    // execution (PostgreSQL keeps custom plans for it) cost ten times its
    // run. Its commit waits for the WAL flush like every other: a claim
    // lost in a server crash after its runs began (a step body runs before
    // its row commits) would return those instances to their queue while
    // they still run, for another worker to claim and run beside them.
    queue_lock: Some(
        "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), \
         pg_advisory_xact_lock(1801808241, hashtext($1))",
    ),
    server_now_us: Some("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint"),
    picked_ids: resume::any_of_array,
    indexed_by: false,
    ..Dialect::plain(
        "keiro.",
        resume::registered_match,
        resume::registered_rows,
        resume::json_text_elements,
    )
};

/// PostgreSQL's text of the shared statements, built on first use.
pub(crate) static SQL: LazyLock<Statements> = LazyLock::new(|| Statements::new(&DIALECT));

/// How long connecting (and acquiring a pooled connection) may take before
/// the store reports the server as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL journal store.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Whether a transaction-pooling proxy stands in front of the server
    /// ([`crate::Pooler::Transaction`]).
    pooled: bool,
    /// Held by every clone of the store: the host watcher of a URL with
    /// several hosts stops when the last clone is dropped.
    _alive: Arc<()>,
    /// [`StoreOptions::listen_url`]: where `LISTEN` connects (else to the
    /// pool's server, unless `pooled`).
    listen_url: Option<Box<PgConnectOptions>>,
    /// Where this store's "now" comes from.
    pub(crate) clock: crate::Clock,
    /// The empty transaction the last transactional step left for the next
    /// (see [`crate::warm`]); `None` behind a proxy, with several hosts or
    /// on a pool of one connection.
    pub(crate) warm: Option<Arc<crate::warm::WarmTx<Postgres>>>,
}

/// How long a pooled connection may sit idle before its next checkout pings
/// it first.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

impl PostgresStore {
    /// Connects to the PostgreSQL database at `url` and migrates it (unless
    /// [`StoreOptions::migrate`] is `false`).
    ///
    /// Concurrent processes may connect and migrate at the same time: the
    /// migrations run under advisory locks.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<PostgresStore> {
        let parsed = url::parse(url)?;
        let pooled = parsed.pooler.unwrap_or(options.pooler) == crate::Pooler::Transaction;
        let direct = match &options.listen_url {
            Some(listen_url) => Some(url::parse(listen_url)?.hosts.swap_remove(0)),
            None => None,
        };
        let mut all = parsed.hosts;
        if pooled {
            // No statement kept by name; no startup parameter a proxy may
            // refuse (pgbouncer 1.18 refuses `extra_float_digits`).
            all = all
                .into_iter()
                .map(|host| host.statement_cache_capacity(0).extra_float_digits(None))
                .collect();
            crate::prepared::prepare_unnamed();
        }
        let connect_error = |url: &str, source: sqlx::Error| StoreError::Connect {
            url: redact(url),
            source: Arc::new(source),
        };
        // Several hosts: the one that accepts writes now.
        let hosts = if all.len() > 1 {
            let current = failover::find_writable(&all).await.map_err(|why| {
                connect_error(
                    url,
                    sqlx::Error::Configuration(format!("no host accepts writes: {why}").into()),
                )
            })?;
            Some(Arc::new(failover::Hosts::new(all.clone(), current)))
        } else {
            None
        };
        let connect = match &hosts {
            Some(hosts) => hosts.current_options(),
            None => all.swap_remove(0),
        };

        // One connection first: the pool retries a refused connection until
        // its timeout and then reports only `PoolTimedOut`, while this
        // reports why the server cannot be reached, at once.
        let mut conn = connect_once(&connect)
            .await
            .map_err(|e| connect_error(url, e))?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.unwrap_or(8))
            .acquire_timeout(CONNECT_TIMEOUT)
            // sqlx pings every connection before handing it out, which
            // costs each statement an extra round trip. A connection back
            // from its last use (where sqlx pinged it on release) within
            // `PING_IDLE_AFTER` is handed out as it is; one idle for longer
            // (the server may have restarted meanwhile) is pinged first and
            // replaced when dead.
            .test_before_acquire(false)
            .before_acquire({
                let hosts = hosts.clone();
                move |conn, meta| {
                    // A connection to the host the pool left is closed.
                    let stale = hosts.as_ref().is_some_and(|h| h.is_stale(meta.age));
                    Box::pin(async move {
                        if stale {
                            return Ok(false);
                        }
                        if meta.idle_for > PING_IDLE_AFTER {
                            conn.ping().await?;
                        }
                        Ok(true)
                    })
                }
            })
            .after_connect({
                let hosts = hosts.clone();
                move |conn, _| {
                    let hosts = hosts.clone();
                    Box::pin(async move {
                        // With several hosts, never a connection to one that
                        // cannot take writes (a demoted primary): one to the
                        // host that takes writes now stands in for it.
                        let Some(hosts) = hosts else { return Ok(()) };
                        if failover::accepts_writes(conn).await? {
                            return Ok(());
                        }
                        match hosts.writable_instead().await {
                            Some(writable) => {
                                *conn = writable;
                                Ok(())
                            }
                            None => Err(sqlx::Error::Configuration(
                                "no PostgreSQL host accepts writes now".into(),
                            )),
                        }
                    })
                }
            })
            .connect_lazy_with(connect);
        let migrate = async {
            if options.migrate {
                let migrated = match (&direct, &options.listen_url) {
                    // Session locks need a session: the direct server's.
                    (Some(direct), Some(listen_url)) if pooled => {
                        let mut session = connect_once(direct)
                            .await
                            .map_err(|e| connect_error(listen_url, e))?;
                        let migrated = migrate::on_session(&mut session).await;
                        let _ = session.close().await;
                        migrated
                    }
                    _ if pooled => migrate::in_transaction(&mut conn).await,
                    _ => migrate::on_session(&mut conn).await,
                };
                migrated.map_err(|e| StoreError::Migrate {
                    backend: "postgres",
                    source: Arc::new(e),
                })?;
            }
            // The session (and its advisory locks) ends here; an error
            // closing it changes nothing for the store.
            let _ = conn.close().await;
            Ok::<(), StoreError>(())
        };
        // The pool's first connections open while the migration runs: each
        // costs the server a process start (milliseconds on a small
        // machine), and a store's first work (registering its executor, a
        // first resume pass) wants two at once. The first must open, as the
        // pool's own connect would insist; the second opens in the
        // background, and if it cannot, again when needed. A pool of at
        // most two keeps to one connection beside the migration's session,
        // opened after it closed.
        let first = async {
            pool.acquire()
                .await
                .map(drop)
                .map_err(|e| connect_error(url, e))
        };
        if options.max_connections.unwrap_or(8) > 2 {
            let spare = pool.clone();
            tokio::spawn(async move { drop(spare.acquire().await) });
            tokio::try_join!(migrate, first)?;
        } else {
            migrate.await?;
            first.await?;
        }

        let alive = Arc::new(());
        // Not on a pool of one connection, which a kept transaction would
        // hold from every other write until it expires.
        let several = options.max_connections.unwrap_or(8) > 1;
        let warm = (hosts.is_none() && !pooled && several).then(Arc::default);
        if let Some(hosts) = hosts {
            hosts.watch(pool.clone(), Arc::downgrade(&alive));
        }
        Ok(PostgresStore {
            pool,
            _alive: alive,
            pooled,
            listen_url: direct.map(Box::new),
            clock: options.clock.clone(),
            warm,
        })
    }

    /// The underlying pool, for tests and benchmarks.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The pool as the executor of one statement that commits alone (see
    /// [`PgExec`]).
    pub(crate) fn exec(&self) -> PgExec<'_> {
        PgExec {
            pool: &self.pool,
            pooled: self.pooled,
        }
    }

    /// A lone write statement's turn: none here (PostgreSQL writers do not
    /// share one lock; see the SQLite store's).
    pub(crate) async fn write_turn(&self) -> Option<()> {
        None
    }

    /// Whether a transaction-pooling proxy stands in front of the server.
    pub fn is_pooled(&self) -> bool {
        self.pooled
    }

    /// A transaction for a transactional step: the one the last such step
    /// left open and empty (see [`crate::warm`]), else a new one.
    ///
    /// Behind a transaction-pooling proxy the new one first drops every
    /// prepared statement the server connection holds (`DEALLOCATE ALL`, in
    /// the `BEGIN`'s round trip): sqlx gives a body's statements names
    /// (`sqlx_s_1`, …) counted per client connection and never closes them,
    /// so a statement another client's transaction left on this server
    /// connection would collide with the body's own (`42P05`). Within the
    /// transaction the server connection is this client's alone.
    pub(crate) async fn begin_step(
        &self,
        op: &'static str,
    ) -> Result<Transaction<'static, Postgres>> {
        match self.warm.as_ref().and_then(|warm| warm.take(&self.pool)) {
            Some(tx) => Ok(tx),
            None if self.pooled => self
                .pool
                .begin_with("BEGIN; DEALLOCATE ALL")
                .await
                .map_err(StoreError::query(op)),
            // Not [`PostgresStore::begin`]: the application's code runs
            // between the statements of this one, as long as it needs.
            None => self.pool.begin().await.map_err(StoreError::query(op)),
        }
    }

    /// Keeps `tx`, open and empty after a transactional step's commit, for
    /// the next one; without a [`crate::warm`] slot it is rolled back.
    pub(crate) fn keep_warm(&self, tx: Transaction<'static, Postgres>) {
        if let Some(warm) = &self.warm {
            warm.keep(&self.pool, tx);
        }
    }

    /// Closes the pool, returning a kept transaction first.
    pub(crate) async fn close(&self) {
        drop(self.warm.as_ref().and_then(|warm| warm.take(&self.pool)));
        self.pool.close().await;
    }

    /// Begins a transaction for operation `op`, one the server ends if it
    /// sits idle too long (see [`BEGIN`]).
    pub(crate) async fn begin(&self, op: &'static str) -> Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with(BEGIN)
            .await
            .map_err(StoreError::query(op))
    }

    /// [`PostgresStore::begin`] for a transaction of the writer's batch
    /// statements, which run every statement on a generic plan.
    ///
    /// A batch statement takes its rows as arrays (`UNNEST($1::text[], ..)`),
    /// whose length a generic plan does not know. For the small batches of a
    /// lightly loaded or rate-limited runtime PostgreSQL's plan cache then
    /// judges a plan made for the actual arrays cheaper, and plans the
    /// statement again at every execution: planning an UPDATE of the
    /// workflows table (which weighs each of its indexes) cost as much server
    /// time as running it. The generic plan (an index lookup per row) is the
    /// right one at every batch size. `SET LOCAL` ends with the transaction,
    /// so the connection goes back to the pool unchanged, and it travels in
    /// the same round trip as `BEGIN`.
    pub(crate) async fn begin_batch(
        &self,
        op: &'static str,
    ) -> Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with(BEGIN_BATCH)
            .await
            .map_err(StoreError::query(op))
    }

    /// A connection for several statements of operation `op` that each
    /// commit alone; behind a transaction-pooling proxy one transaction for
    /// all of them. [`PgSession::done`] ends it.
    pub(crate) async fn acquire(&self, op: &'static str) -> Result<PgSession> {
        if self.pooled {
            Ok(PgSession::Pooled(self.begin(op).await?))
        } else {
            let conn: PoolConnection<Postgres> =
                self.pool.acquire().await.map_err(StoreError::query(op))?;
            Ok(PgSession::Direct(conn))
        }
    }
}

/// What keiro begins its own transactions with: `BEGIN` at READ COMMITTED,
/// and a bound on how long the transaction may sit idle waiting for keiro's
/// next statement before the server ends the session, rolling it back and
/// releasing its locks.
///
/// READ COMMITTED whatever the server's default (a role set to
/// `serializable` for its transactional steps, say): keiro's transactions
/// that take a lock first (a queue's claims, a debounce burst) count and
/// read what the lock's previous holder committed, which needs each
/// statement to read a fresh snapshot; at a higher level the snapshot is
/// taken while the lock is awaited, and misses it.
///
/// keiro sends a transaction's statements back to back, so an idle one is a
/// client that can no longer reach the server: its process stalled, or the
/// network between them drops everything without closing the connection.
/// The server would otherwise keep such a transaction open, and its locks
/// held, until the operating system's TCP keepalive gives up on the
/// connection (hours, by default): a queue's claim lock would stop every
/// worker's claims of that queue, and row locks would hide instances from
/// other workers' claims (`SKIP LOCKED`) long after their leases lapsed.
/// `SET LOCAL` ends with the transaction (also behind a transaction-pooling
/// proxy), and travels in the `BEGIN`'s round trip. A transactional step's
/// transaction does not begin with it: the application's code runs inside
/// it, as long as it needs (a step's time limit bounds it instead, see
/// `StepTx::limit_statements`).
pub(super) const BEGIN: &str = concat!("BEGIN ISOLATION LEVEL READ COMMITTED; ", bound_idle!());

/// The statement bounding the idle time of the transaction it runs in to
/// five seconds (see [`BEGIN`]).
macro_rules! bound_idle {
    () => {
        "SET LOCAL idle_in_transaction_session_timeout = '5s'"
    };
}
pub(crate) use bound_idle;

/// What [`PostgresStore::begin_batch`] begins a transaction with: [`BEGIN`]
/// and a generic plan for each statement.
const BEGIN_BATCH: &str = concat!(
    "BEGIN ISOLATION LEVEL READ COMMITTED; ",
    bound_idle!(),
    "; SET LOCAL plan_cache_mode = force_generic_plan"
);

/// One connection to `connect`, or an error within [`CONNECT_TIMEOUT`].
pub(super) async fn connect_once(
    connect: &PgConnectOptions,
) -> std::result::Result<PgConnection, sqlx::Error> {
    tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(connect))
        .await
        .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            ))
        })?
}
