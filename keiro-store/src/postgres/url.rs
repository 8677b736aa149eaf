//! keiro's own parameters in a PostgreSQL URL, taken out before sqlx reads
//! the rest.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use crate::error::redact;
use crate::{Pooler, Result, StoreError};

/// A PostgreSQL URL read: what sqlx connects with, and keiro's parameters.
#[derive(Debug)]
pub(crate) struct PgUrl {
    /// The connection settings of the first host.
    pub(crate) connect: PgConnectOptions,
    /// Those of every host, in the URL's order (`postgres://a:5432,b:5433/db`
    /// lists two; one for a URL with one host).
    pub(crate) hosts: Vec<PgConnectOptions>,
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
            // keiro always needs the writable server: with several hosts it
            // connects to the one that accepts writes.
            Some(("target_session_attrs", "read-write" | "primary" | "any")) => {}
            Some(("target_session_attrs", other)) => {
                return Err(invalid(format!(
                    "target_session_attrs={other} would connect to a server that cannot take \
                     writes; keiro journals, so it needs `read-write` (or `primary`), which is \
                     what it uses with several hosts"
                )))
            }
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
    let query = if rest.is_empty() {
        String::new()
    } else {
        format!("?{}", rest.join("&"))
    };
    let mut hosts = Vec::new();
    for one in split_hosts(base) {
        let connect = PgConnectOptions::from_str(&format!("{one}{query}"))
            .map_err(|error| invalid(error.to_string()))?;
        hosts.push(connect);
    }
    Ok(PgUrl {
        connect: hosts[0].clone(),
        hosts,
        pooler,
    })
}

/// `scheme://userinfo@h1:p1,h2:p2/path` as one URL per host, each with the
/// same user information and path; a URL with one host as it is.
fn split_hosts(base: &str) -> Vec<String> {
    let Some((scheme, rest)) = base.split_once("://") else {
        return vec![base.to_owned()];
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (userinfo, host_list) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if !host_list.contains(',') {
        return vec![base.to_owned()];
    }
    host_list
        .split(',')
        .map(|host| format!("{scheme}://{userinfo}{host}{path}"))
        .collect()
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
    fn several_hosts_become_one_target_each() {
        let url = parse(
            "postgresql://app:pw@db1:5432,db2:5433,[::1]/keiro?target_session_attrs=read-write\
             &sslmode=disable",
        )
        .unwrap();
        let hosts: Vec<(String, u16)> = url
            .hosts
            .iter()
            .map(|h| (h.get_host().to_owned(), h.get_port()))
            .collect();
        assert_eq!(hosts[0], ("db1".to_owned(), 5432));
        assert_eq!(hosts[1], ("db2".to_owned(), 5433));
        assert_eq!(hosts[2].1, 5432);
        for host in &url.hosts {
            assert_eq!(host.get_database(), Some("keiro"));
            assert_eq!(host.get_username(), "app");
        }
        assert_eq!(parse("postgres://h/db").unwrap().hosts.len(), 1);
    }

    #[test]
    fn a_session_attribute_that_cannot_write_is_refused() {
        let error = parse("postgres://a,b/db?target_session_attrs=standby").unwrap_err();
        assert!(
            error.to_string().contains("target_session_attrs=standby"),
            "{error}"
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
