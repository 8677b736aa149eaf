//! Connection settings.

/// SQLite's `synchronous` setting for the journal file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SqliteSynchronous {
    /// `synchronous=FULL`: a recorded step survives power loss (the default).
    #[default]
    Full,
    /// `synchronous=NORMAL`: in WAL mode a recorded step survives a crash of the
    /// process but the last commits may be lost on power loss. Faster per step.
    Normal,
}

/// What stands between keiro and PostgreSQL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// A direct connection, or a proxy that gives each client connection a
    /// server connection of its own for as long as it lasts (pgbouncer's
    /// `pool_mode = session`). The default.
    #[default]
    None,
    /// A transaction-pooling proxy (pgbouncer's `pool_mode = transaction`,
    /// RDS Proxy, the poolers of managed PostgreSQL services): consecutive
    /// transactions of one client connection may run on different server
    /// connections. keiro then keeps no state in a session: every statement
    /// is prepared unnamed (for every PostgreSQL store of the process) and
    /// runs inside a transaction, no session lock or setting outlives a
    /// transaction, `LISTEN` goes to [`StoreOptions::listen_url`] (workers
    /// poll when it is unset) and migrations run there too (else through
    /// the proxy, in one transaction). Also set by the URL parameter
    /// `pooler=transaction`.
    Transaction,
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Durability of the SQLite journal; ignored by PostgreSQL.
    pub sqlite_synchronous: SqliteSynchronous,
    /// The connection pool's size. Default: 8 for PostgreSQL, 4 for SQLite
    /// (SQLite has one writer; extra connections only serve reads).
    pub max_connections: Option<u32>,
    /// Whether [`Store::connect`](crate::Store::connect) runs the embedded
    /// migrations (default `true`). With `false` it changes no schema and
    /// creates nothing: a missing SQLite file is a connect error, and a
    /// database whose schema is older than this build's is refused with
    /// [`StoreError::NotMigrated`](crate::StoreError::NotMigrated). For tools
    /// (the `keiro` command) that must not migrate behind an operator's back.
    pub migrate: bool,
    /// Where the store's "now" comes from (default: the system clock).
    pub clock: crate::Clock,
    /// What stands between keiro and PostgreSQL (default: nothing);
    /// ignored by SQLite.
    pub pooler: Pooler,
    /// A direct PostgreSQL URL (bypassing a transaction-pooling proxy) for
    /// the `LISTEN` connection that wakes workers at once, and for
    /// migrations. Used only with [`Pooler::Transaction`]; without it,
    /// workers find new work by polling.
    pub listen_url: Option<String>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            sqlite_synchronous: SqliteSynchronous::Full,
            max_connections: None,
            migrate: true,
            clock: crate::Clock::system(),
            pooler: Pooler::None,
            listen_url: None,
        }
    }
}
