//! Fresh databases on a PostgreSQL server named by an environment variable.

use sqlx::{Connection, PgConnection};

use crate::{redact_url, with_database, DEFAULT_POSTGRES_URL};

/// A PostgreSQL server that databases of one's own are created on: the URL
/// an environment variable holds, connected to as an admin (a role with
/// `CREATEDB`).
#[derive(Clone)]
pub struct PostgresServer {
    var: &'static str,
    url: String,
}

impl std::fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresServer")
            .field("var", &self.var)
            .field("url", &self.redacted_url())
            .finish()
    }
}

/// A database made by [`PostgresServer::create_database`].
/// Its `Debug` hides the URL's credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresDatabase {
    /// Its name: the prefix it was asked for and a UUID.
    pub name: String,
    /// The server's URL with the database replaced by this one.
    pub url: String,
}

impl std::fmt::Debug for PostgresDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresDatabase")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .finish()
    }
}

/// What went wrong reaching the server or creating or dropping a database.
/// Every message names the variable and the server's URL (password hidden).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// The admin connection failed.
    #[error(
        "cannot reach the PostgreSQL server {var}=`{url}` ({source}); start it (`.ci/run` \
         does) or set {var} to a database a role with CREATEDB can connect to"
    )]
    Unreachable {
        /// The variable naming the server.
        var: &'static str,
        /// The server's URL, password hidden.
        url: String,
        /// The connection error.
        source: sqlx::Error,
    },
    /// `CREATE DATABASE` failed.
    #[error("cannot create database `{name}` through {var}=`{url}`: {source}")]
    Create {
        /// The database asked for.
        name: String,
        /// The variable naming the server.
        var: &'static str,
        /// The server's URL, password hidden.
        url: String,
        /// The statement's error.
        source: sqlx::Error,
    },
    /// `DROP DATABASE` failed.
    #[error("cannot drop database `{name}` through {var}=`{url}`: {source}")]
    Drop {
        /// The database to drop.
        name: String,
        /// The variable naming the server.
        var: &'static str,
        /// The server's URL, password hidden.
        url: String,
        /// The statement's error.
        source: sqlx::Error,
    },
}

impl PostgresServer {
    /// The server `var` names, or [`DEFAULT_POSTGRES_URL`] when `var` is unset
    /// or empty.
    pub fn from_env(var: &'static str) -> PostgresServer {
        let url = std::env::var(var)
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned());
        PostgresServer { var, url }
    }

    /// The variable the server's URL came from.
    pub fn var(&self) -> &'static str {
        self.var
    }

    /// The server's URL as given (it may hold a password: print
    /// [`PostgresServer::redacted_url`] instead).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's URL with its password hidden.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Creates a fresh, empty database named `<prefix><uuid>` and returns its
    /// name and URL.
    pub async fn create_database(&self, prefix: &str) -> Result<PostgresDatabase, PostgresError> {
        let name = format!("{prefix}{}", uuid::Uuid::new_v4().simple());
        self.admin_statement(&format!("CREATE DATABASE \"{name}\""), |source| {
            PostgresError::Create {
                name: name.clone(),
                var: self.var,
                url: self.redacted_url(),
                source,
            }
        })
        .await?;
        let url = with_database(&self.url, &name);
        Ok(PostgresDatabase { name, url })
    }

    /// Drops database `name` if it exists, disconnecting any session still on
    /// it (`WITH (FORCE)`).
    pub async fn drop_database(&self, name: &str) -> Result<(), PostgresError> {
        self.admin_statement(
            &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
            |source| PostgresError::Drop {
                name: name.to_owned(),
                var: self.var,
                url: self.redacted_url(),
                source,
            },
        )
        .await
    }

    /// Runs `statement` on a connection of its own to the server, closed
    /// afterwards, reporting its failure through `failed`.
    async fn admin_statement(
        &self,
        statement: &str,
        failed: impl FnOnce(sqlx::Error) -> PostgresError,
    ) -> Result<(), PostgresError> {
        let mut admin = self.admin().await?;
        let done = sqlx::query(statement).execute(&mut admin).await;
        let _ = admin.close().await;
        done.map(drop).map_err(failed)
    }

    async fn admin(&self) -> Result<PgConnection, PostgresError> {
        PgConnection::connect(&self.url)
            .await
            .map_err(|source| PostgresError::Unreachable {
                var: self.var,
                url: self.redacted_url(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_variable_and_hide_the_password() {
        let err = PostgresError::Unreachable {
            var: "KEIRO_TEST_POSTGRES_URL",
            url: redact_url("postgres://bob:hunter2@db/keiro"),
            source: sqlx::Error::PoolClosed,
        };
        let message = err.to_string();
        assert!(message.contains("KEIRO_TEST_POSTGRES_URL=`postgres://bob:***@db/keiro`"));
        assert!(!message.contains("hunter2"));
    }
}
