//! Which database, and connecting to it as an operator: no migrations, no
//! executor identity, no worker.

use keiro::Keiro;

use crate::args::DATABASE_ENV;
use crate::Failure;

/// The URL given with `--database` or in `KEIRO_DATABASE_URL` (clap reads
/// both); none is a usage error saying how to give one.
pub(crate) fn database_url(given: Option<String>) -> Result<String, Failure> {
    match given {
        Some(url) if !url.trim().is_empty() => Ok(url),
        _ => Err(Failure::Usage(format!(
            "no keiro database given: pass --database URL or set {DATABASE_ENV} \
             (e.g. sqlite:keiro.db or postgres://user@host/db)"
        ))),
    }
}

/// A runtime on `url` for operating it: it never migrates (an older schema
/// is refused, asking for `keiro migrate`), creates no SQLite file, and,
/// since it runs no workflow and starts no resume worker, takes no executor
/// identity and leaves no executor row.
pub(crate) async fn operator(url: &str) -> Result<Keiro, Failure> {
    let connected = Keiro::builder(url)
        .migrate(false)
        .max_connections(2)
        .connect()
        .await;
    match connected {
        Ok(keiro) => Ok(keiro),
        // Without migrating, a SQLite file that does not exist is not
        // created: say how to create one, as SQLite only says it cannot
        // open it.
        Err(keiro::Error::Store(error @ keiro::StoreError::Connect { .. }))
            if url.starts_with("sqlite:") =>
        {
            Err(Failure::Refused(format!(
                "{error} (is the path right? `keiro migrate` creates and migrates a new database)"
            )))
        }
        Err(error) => Err(error.into()),
    }
}
