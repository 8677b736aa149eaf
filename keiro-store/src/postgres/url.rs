//! keiro's own parameters in a PostgreSQL URL, taken out before sqlx reads
//! the rest.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use crate::error::redact;
use crate::{Pooler, Result, StoreError};

/// A PostgreSQL URL read: what sqlx connects with, and keiro's parameters.
#[derive(Debug)]
pub(crate) struct PgUrl {
    /// The connection settings of every host, in the URL's order
    /// (`postgres://a:5432,b:5433/db` lists two; one for a URL with one
    /// host): never empty.
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
    // libpq's other spelling of several hosts: `?host=a,b&port=5432,5433`.
    let (mut host_list, mut port_list) = (None, None);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("host", value)) if value.contains(',') => host_list = Some(value),
            Some(("port", value)) if value.contains(',') => port_list = Some(value),
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
    let mut targets = split_hosts(base);
    if let Some(host_list) = host_list {
        let names: Vec<&str> = host_list.split(',').collect();
        let ports: Vec<&str> = port_list.map_or_else(Vec::new, |p| p.split(',').collect());
        if ports.len() > 1 && ports.len() != names.len() {
            return Err(invalid(format!(
                "{} hosts but {} ports: give one port for all hosts or one per host",
                names.len(),
                ports.len()
            )));
        }
        let (scheme, userinfo, _, path) = authority_parts(base);
        targets = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let port = match ports.len() {
                    0 => String::new(),
                    1 => format!(":{}", ports[0]),
                    _ => format!(":{}", ports[i]),
                };
                format!("{scheme}://{userinfo}{name}{port}{path}")
            })
            .collect();
    } else if port_list.is_some() {
        return Err(invalid(
            "several ports but one host: list the hosts too (`host=a,b&port=5432,5433`)".into(),
        ));
    }
    finish(targets, &query, pooler, &invalid)
}

/// Parses each of `targets` (with `query` appended) as one host.
fn finish(
    targets: Vec<String>,
    query: &str,
    pooler: Option<Pooler>,
    invalid: &dyn Fn(String) -> StoreError,
) -> Result<PgUrl> {
    let mut hosts = Vec::new();
    for one in targets {
        let connect = PgConnectOptions::from_str(&format!("{one}{query}"))
            .map_err(|error| invalid(error.to_string()))?;
        hosts.push(connect);
    }
    Ok(PgUrl { hosts, pooler })
}

/// `scheme://userinfo@hosts/path` as `(scheme, "userinfo@", hosts, "/path")`
/// (empty parts where the URL has none).
fn authority_parts(base: &str) -> (&str, &str, &str, &str) {
    let (scheme, rest) = base.split_once("://").unwrap_or(("postgres", base));
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    (scheme, userinfo, hosts, path)
}

/// `scheme://userinfo@h1:p1,h2:p2/path` as one URL per host, each with the
/// same user information and path; a URL with one host as it is.
fn split_hosts(base: &str) -> Vec<String> {
    if !base.contains("://") {
        return vec![base.to_owned()];
    }
    let (scheme, userinfo, host_list, path) = authority_parts(base);
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
        assert_eq!(url.hosts[0].get_port(), 6432);
        assert_eq!(url.hosts[0].get_database(), Some("db"));
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
    fn hosts_and_ports_may_be_listed_as_parameters() {
        let url = parse(
            "postgresql://app@/keiro?host=db1,db2&port=5432,5433&target_session_attrs=read-write",
        )
        .unwrap();
        let hosts: Vec<(String, u16)> = url
            .hosts
            .iter()
            .map(|h| (h.get_host().to_owned(), h.get_port()))
            .collect();
        assert_eq!(hosts, [("db1".to_owned(), 5432), ("db2".to_owned(), 5433)]);
        let one_port = parse("postgres:///keiro?host=db1,db2&port=6000").unwrap();
        assert!(one_port.hosts.iter().all(|h| h.get_port() == 6000));
        let error = parse("postgres:///keiro?host=a,b,c&port=1,2").unwrap_err();
        assert!(error.to_string().contains("3 hosts but 2 ports"), "{error}");
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
