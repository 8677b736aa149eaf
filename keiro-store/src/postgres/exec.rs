//! Where the store's PostgreSQL statements run: straight on a pooled
//! connection, or (behind a transaction-pooling proxy) inside a transaction
//! of their own.
//!
//! sqlx runs a statement with parameters in two exchanges: it parses and
//! describes it, waits for the server to be ready again, then binds and
//! executes it. Outside a transaction a transaction-pooling proxy may hand
//! the second exchange to another server connection, where the statement
//! does not exist. Inside a transaction the proxy keeps the client on one
//! server connection, so in [`Pooler::Transaction`](crate::Pooler) mode a
//! statement that would have committed alone runs as `BEGIN`, the
//! statement, `COMMIT`: the same effect, two more round trips.

use std::ops::{Deref, DerefMut};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::Describe;
use sqlx::{Either, Execute, Executor, Postgres, Transaction};

use crate::{Result, StoreError};

/// The pool as an executor of single statements (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PgExec<'p> {
    pub(super) pool: &'p PgPool,
    /// Whether each statement gets a transaction of its own.
    pub(super) pooled: bool,
}

impl<'p> Executor<'p> for PgExec<'p> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pool.fetch_many(query);
        }
        let pool = self.pool.clone();
        futures::stream::once(async move {
            let mut tx = pool.begin_with(super::BEGIN).await?;
            let items: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures::stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pool.fetch_optional(query);
        }
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut tx = pool.begin_with(super::BEGIN).await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.pool.describe(sql)
    }
}

/// A connection for several statements that each commit alone
/// ([`super::PostgresStore::acquire`]); in [`Pooler::Transaction`](crate::Pooler)
/// mode a transaction instead, which [`PgSession::done`] commits.
#[derive(Debug)]
pub(crate) enum PgSession {
    /// A pooled connection; each statement commits as it runs.
    Direct(PoolConnection<Postgres>),
    /// One transaction for all of them.
    Pooled(Transaction<'static, Postgres>),
}

impl crate::query::Session for PgSession {
    /// Commits the session's transaction, if it has one. A session dropped
    /// without it rolls that transaction back.
    async fn done(self, op: &'static str) -> Result<()> {
        match self {
            PgSession::Direct(_) => Ok(()),
            PgSession::Pooled(tx) => tx.commit().await.map_err(StoreError::query(op)),
        }
    }
}

impl Deref for PgSession {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            PgSession::Direct(conn) => conn,
            PgSession::Pooled(tx) => tx,
        }
    }
}

impl DerefMut for PgSession {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            PgSession::Direct(conn) => conn,
            PgSession::Pooled(tx) => tx,
        }
    }
}
