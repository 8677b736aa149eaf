//! `keiro migrate`: the one command that changes the schema.

use keiro_store::{Store, StoreError, StoreOptions};
use serde_json::json;

use crate::{Failure, Report};

/// Runs the migrations on `url` (creating a SQLite file that does not
/// exist) and reports the schema version before and after.
pub(crate) async fn migrate(url: &str) -> Result<Report, Failure> {
    let before = version_before(url).await;
    let store = Store::connect(url, &StoreOptions::default()).await?;
    let version = store.schema_version().await;
    let backend = store.backend();
    store.close().await;
    let version = version?.unwrap_or(0);
    let redacted = keiro_store::redact_url(url);
    let human = match before {
        Some(v) if v >= version => {
            format!("{redacted} ({backend}) is at schema version {version}; nothing to migrate\n")
        }
        Some(v) => {
            format!("migrated {redacted} ({backend}) from schema version {v} to {version}\n")
        }
        None => format!("migrated {redacted} ({backend}) to schema version {version}\n"),
    };
    Ok(Report {
        human,
        json: json!({
            "database": redacted,
            "backend": backend,
            "previous_version": before,
            "version": version,
        }),
    })
}

/// The schema version before migrating, when the database exists and can
/// be read without migrating it (`None`: no schema, or it could not tell;
/// the migrating connect then reports any real problem).
async fn version_before(url: &str) -> Option<i64> {
    let options = StoreOptions {
        migrate: false,
        max_connections: Some(1),
        ..StoreOptions::default()
    };
    match Store::connect(url, &options).await {
        Ok(store) => {
            let version = store.schema_version().await.ok().flatten();
            store.close().await;
            version
        }
        Err(StoreError::NotMigrated { version, .. }) => version,
        Err(_) => None,
    }
}
