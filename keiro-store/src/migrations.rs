//! The embedded SQL migrations (listed by `build.rs`) as sqlx migrators.
//!
//! A migration's version, description, checksum and `-- no-transaction`
//! opt-out are derived from its file exactly as sqlx's `migrate!` macro and
//! `Migrator::new` derive them (`<version>_<description>.sql`, SHA-384 of the
//! SQL), so databases migrated by either are up to date for the other.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};

#[allow(dead_code)] // each backend's feature uses its own list
mod files {
    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}
#[cfg(feature = "postgres")]
pub(crate) use files::POSTGRES;
#[cfg(feature = "sqlite")]
pub(crate) use files::SQLITE;

/// A migrator running `files` (`(file name, SQL)`, in version order).
pub(crate) fn migrator(files: &[(&'static str, &'static str)]) -> Migrator {
    let migrations: Vec<Migration> = files
        .iter()
        .map(|&(file, sql)| {
            let (version, rest) = file
                .split_once('_')
                .unwrap_or_else(|| panic!("migration {file}: not `<version>_<description>.sql`"));
            let version: i64 = version
                .parse()
                .unwrap_or_else(|_| panic!("migration {file}: the version is not a number"));
            let description = rest.trim_end_matches(".sql").replace('_', " ");
            Migration::new(
                version,
                Cow::Owned(description),
                MigrationType::Simple,
                Cow::Borrowed(sql),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect();
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sqlx::migrate::Migrator;

    /// The embedded migrators must be what sqlx makes of the same
    /// directories (which `migrate!` embedded before): a database an
    /// earlier build migrated then holds the same versions and checksums,
    /// and a start neither refuses it nor runs a migration twice.
    async fn same_as_sqlx_reads(embedded: &Migrator, dir: &str) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let read = Migrator::new(dir.as_path()).await.unwrap();
        let shape = |m: &Migrator| -> Vec<_> {
            m.iter()
                .map(|m| {
                    let m = m.clone();
                    (
                        m.version,
                        m.description,
                        m.migration_type,
                        m.sql,
                        m.checksum,
                        m.no_tx,
                    )
                })
                .collect()
        };
        assert!(
            !read.migrations.is_empty(),
            "{} holds migrations",
            dir.display()
        );
        assert_eq!(shape(embedded), shape(&read), "{}", dir.display());
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn the_sqlite_migrator_is_sqlxs_own() {
        same_as_sqlx_reads(&crate::SQLITE_MIGRATOR, "migrations/sqlite").await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn the_postgres_migrator_is_sqlxs_own() {
        same_as_sqlx_reads(&crate::POSTGRES_MIGRATOR, "migrations/postgres").await;
    }
}
