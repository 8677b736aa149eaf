//! Which schema version a database is at, and refusing one that is behind
//! this build when the store was opened without migrating
//! ([`StoreOptions::migrate`](crate::StoreOptions::migrate) `false`).

use crate::error::redact;
use crate::{Result, Store, StoreError};

impl Store {
    /// The highest migration applied successfully to this database, `None`
    /// when it has no keiro schema yet.
    pub async fn schema_version(&self) -> Result<Option<i64>> {
        const OP: &str = "schema_version";
        // The bookkeeping table is looked up first: a missing table is "not
        // migrated", while any other failure of the query is an error.
        let (exists, latest) = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => (
                "SELECT COUNT(*) > 0 FROM sqlite_master \
                 WHERE type = 'table' AND name = '_sqlx_migrations'",
                "SELECT MAX(version) FROM _sqlx_migrations WHERE success",
            ),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => (
                "SELECT to_regclass('keiro._sqlx_migrations') IS NOT NULL",
                "SELECT MAX(version) FROM keiro._sqlx_migrations WHERE success",
            ),
        };
        dispatch!(Store, self, |s| {
            let exists: bool = crate::prepared::query_scalar(exists)
                .fetch_one(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            if !exists {
                return Ok(None);
            }
            crate::prepared::query_scalar::<_, Option<i64>>(latest)
                .fetch_one(s.exec())
                .await
                .map_err(StoreError::query(OP))
        })
    }

    /// The highest migration this build embeds for this store's backend:
    /// the version [`Store::schema_version`] reports once migrated.
    pub fn expected_schema_version(&self) -> i64 {
        let migrator = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => &crate::SQLITE_MIGRATOR,
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => &crate::POSTGRES_MIGRATOR,
        };
        migrator.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// Refuses a database whose schema is behind this build with
    /// [`StoreError::NotMigrated`]. A newer schema is accepted: migrations
    /// only add, so an older build still reads and writes what it knows.
    pub(crate) async fn require_migrated(&self, url: &str) -> Result<()> {
        let version = self.schema_version().await?;
        let expected = self.expected_schema_version();
        if version.is_some_and(|v| v >= expected) {
            return Ok(());
        }
        Err(StoreError::NotMigrated {
            url: redact(url),
            version,
            expected,
        })
    }
}
