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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            sqlite_synchronous: SqliteSynchronous::Full,
            max_connections: None,
            migrate: true,
            clock: crate::Clock::system(),
        }
    }
}
