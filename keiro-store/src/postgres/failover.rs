//! Several hosts in one URL (`postgres://a:5432,b:5433/db`): the store
//! connects to the one that accepts writes and follows the writable server
//! when it moves (a switchover, or a standby promoted after the primary
//! died).
//!
//! Every new pooled connection checks that its server accepts writes; a
//! watcher checks the current server once a second through the pool and,
//! when it is gone or no longer writable, probes every host and points the
//! pool at the writable one. Connections made before that move are dropped
//! when next checked out, so no statement goes to the old server after the
//! move. A statement in flight when the server went away fails with a
//! transient error, and keiro retries it as it does after any lost
//! connection.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{Connection, Executor, Row};

use super::connect_once;

/// How often the watcher checks the current server.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How long one check may take before the server counts as gone.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The hosts of one URL and which of them the pool uses.
#[derive(Debug)]
pub(crate) struct Hosts {
    all: Vec<PgConnectOptions>,
    current: AtomicUsize,
    /// The origin of [`Hosts::moved_at`].
    base: Instant,
    /// Nanoseconds after `base` when the pool last moved to another host
    /// (0: never).
    moved_at: AtomicU64,
    /// Wakes the watcher before its next tick: a new connection found its
    /// server read-only.
    check_now: tokio::sync::Notify,
    /// Set with [`Hosts::check_now`]: the pool's host refused writes, so
    /// the watcher looks for the writable one without asking the pool
    /// first (whose new connections now go elsewhere: see
    /// [`Hosts::writable_instead`]).
    suspect: AtomicBool,
}

impl Hosts {
    /// `all` (at least two), with the pool on host `current`.
    pub(crate) fn new(all: Vec<PgConnectOptions>, current: usize) -> Hosts {
        Hosts {
            all,
            current: AtomicUsize::new(current),
            base: Instant::now(),
            moved_at: AtomicU64::new(0),
            check_now: tokio::sync::Notify::new(),
            suspect: AtomicBool::new(false),
        }
    }

    /// The connection settings of the host the pool uses.
    pub(crate) fn current_options(&self) -> PgConnectOptions {
        self.all[self.current.load(Ordering::Acquire)].clone()
    }

    /// Whether a connection `age` old was made before the pool last moved.
    pub(crate) fn is_stale(&self, age: Duration) -> bool {
        let moved_at = self.moved_at.load(Ordering::Acquire);
        if moved_at == 0 {
            return false;
        }
        let made_at = self.base.elapsed().saturating_sub(age);
        made_at < Duration::from_nanos(moved_at)
    }

    /// Checks the current server once a second until the pool closes or
    /// `alive` has no strong reference left (every store holding it is
    /// gone), moving the pool to the writable host when the current one is
    /// gone or read-only.
    pub(crate) fn watch(self: Arc<Self>, pool: PgPool, alive: Weak<()>) {
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(WATCH_EVERY) => {}
                    _ = self.check_now.notified() => {}
                }
                if pool.is_closed() || alive.strong_count() == 0 {
                    return;
                }
                let check = tokio::time::timeout(CHECK_TIMEOUT, async {
                    let mut conn = pool.acquire().await?;
                    accepts_writes(&mut conn).await
                })
                .await;
                let suspect = self.suspect.swap(false, Ordering::AcqRel);
                if !suspect && matches!(check, Ok(Ok(true))) {
                    continue;
                }
                match find_writable(&self.all).await {
                    Ok(index) if index != self.current.load(Ordering::Acquire) => {
                        self.move_to(&pool, index)
                    }
                    Ok(_) => {}
                    Err(why) => tracing::warn!(%why, "keiro finds no writable PostgreSQL host"),
                }
            }
        });
    }

    /// Has the watcher look for the writable host now instead of at its
    /// next tick: the pool's host refused writes.
    fn check_now(&self) {
        self.suspect.store(true, Ordering::Release);
        self.check_now.notify_one();
    }

    /// A new connection's server does not take writes (the pool's host was
    /// demoted): a connection to the host that takes writes now, to use in
    /// its place, and the watcher moves the pool there at once. The pool
    /// must not hand out a connection to a read-only server (a standby may
    /// lag behind the new primary, and a journal read there could miss a
    /// step), nor refuse the connection: sqlx 0.8.6 does not retry the
    /// connect after `after_connect` fails, so the caller would wait out its
    /// acquire timeout. `None` when no host takes writes.
    pub(crate) async fn writable_instead(&self) -> Option<PgConnection> {
        self.check_now();
        connect_writable(&self.all).await.ok().map(|(_, conn)| conn)
    }

    fn move_to(&self, pool: &PgPool, index: usize) {
        let to = &self.all[index];
        pool.set_connect_options(to.clone());
        self.current.store(index, Ordering::Release);
        let now = self.base.elapsed().as_nanos().max(1);
        self.moved_at
            .store(u64::try_from(now).unwrap_or(u64::MAX), Ordering::Release);
        tracing::warn!(
            host = %to.get_host(),
            port = to.get_port(),
            "keiro moved to the writable PostgreSQL host"
        );
    }
}

/// Whether the server behind `conn` accepts writes (one simple-protocol
/// exchange).
pub(crate) async fn accepts_writes(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let row = conn.fetch_one("SHOW transaction_read_only").await?;
    Ok(row.try_get::<String, _>(0)? == "off")
}

/// The index of the first host in `all` that accepts writes, or why none
/// does (each host's answer).
pub(crate) async fn find_writable(all: &[PgConnectOptions]) -> Result<usize, String> {
    let (index, conn) = connect_writable(all).await?;
    let _ = conn.close().await;
    Ok(index)
}

/// A connection to the first host in `all` that accepts writes, with its
/// index, or why none does (each host's answer).
async fn connect_writable(all: &[PgConnectOptions]) -> Result<(usize, PgConnection), String> {
    let mut answers = Vec::new();
    for (index, host) in all.iter().enumerate() {
        let name = format!("{}:{}", host.get_host(), host.get_port());
        match connect_once(host).await {
            Ok(mut conn) => match accepts_writes(&mut conn).await {
                Ok(true) => return Ok((index, conn)),
                Ok(false) => {
                    let _ = conn.close().await;
                    answers.push(format!("{name} is read-only (a standby?)"));
                }
                Err(error) => answers.push(format!("{name}: {error}")),
            },
            Err(error) => answers.push(format!("{name}: {error}")),
        }
    }
    Err(answers.join("; "))
}
