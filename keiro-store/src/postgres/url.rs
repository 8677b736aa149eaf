//! keiro's own parameters in a PostgreSQL URL, taken out before sqlx reads
//! the rest.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use crate::error::redact;
use crate::{Pooler, Result, StoreError};

/// A PostgreSQL URL read: what sqlx connects with, and keiro's parameters.
#[derive(Debug)]
pub(crate) struct PgUrl {
    /// The connection settings.
    pub(crate) connect: PgConnectOptions,
    /// `pooler=transaction|none`, when given.
    pub(crate) pooler: Option<Pooler>,
}

/// Reads `url`; a bad parameter value or a URL sqlx refuses is
/// [`StoreError::InvalidUrl`] naming the URL (password hidden) and why.
pub(crate) fn parse(url: &str) -> Result<PgUrl> {
    let invalid = |reason: String| StoreError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pooler = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("pooler", value)) => {
                pooler = Some(match value {
                    "transaction" => Pooler::Transaction,
                    "none" | "session" => Pooler::None,
                    other => {
                        return Err(invalid(format!(
                            "unknown pooler `{other}`: expected `pooler=transaction` (a \
                             transaction-pooling proxy such as pgbouncer in transaction mode) or \
                             `pooler=none`"
                        )))
                    }
                })
            }
            _ => rest.push(pair),
        }
    }
    let sqlx_url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    let connect =
        PgConnectOptions::from_str(&sqlx_url).map_err(|error| invalid(error.to_string()))?;
    Ok(PgUrl { connect, pooler })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooler_parameter_is_read_and_removed() {
        let url = parse("postgres://u@h:6432/db?sslmode=disable&pooler=transaction").unwrap();
        assert_eq!(url.pooler, Some(Pooler::Transaction));
        assert_eq!(url.connect.get_port(), 6432);
        assert_eq!(url.connect.get_database(), Some("db"));
        assert_eq!(parse("postgres://h/db").unwrap().pooler, None);
        assert_eq!(
            parse("postgres://h/db?pooler=none").unwrap().pooler,
            Some(Pooler::None)
        );
    }

    #[test]
    fn unknown_pooler_is_refused_by_name() {
        let error = parse("postgres://u:secret@h/db?pooler=statement").unwrap_err();
        let message = error.to_string();
        assert!(message.contains("unknown pooler `statement`"), "{message}");
        assert!(!message.contains("secret"), "{message}");
    }
}
