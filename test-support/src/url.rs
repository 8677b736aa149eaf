//! Rewriting a PostgreSQL URL to name another database.

/// Returns `url` with its database replaced by `database`, keeping the scheme,
/// credentials, host, port and query parameters (a `dbname` parameter, which
/// would override the path, is dropped).
///
/// ```text
/// postgres:///keiro_test              -> postgres:///<database>
/// postgres://u:pw@h:5432/db?ssl=x     -> postgres://u:pw@h:5432/<database>?ssl=x
/// postgres://h                        -> postgres://h/<database>
/// ```
///
/// A URL without `://` is taken as a bare authority.
pub fn with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => (&url[..at + 3], &url[at + 3..]),
        None => ("", url),
    };
    let (before_query, query) = match rest.find('?') {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let authority = match before_query.find('/') {
        Some(at) => &before_query[..at],
        None => before_query,
    };
    let mut out = format!("{scheme}{authority}/{database}");
    let params: Vec<&str> = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty() && !p.starts_with("dbname="))
        .collect();
    if !params.is_empty() {
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn with_database_replaces_only_the_database() {
        assert_eq!(
            with_database("postgres:///keiro_test", "t1"),
            "postgres:///t1"
        );
        assert_eq!(
            with_database(
                "postgres://u:pw@db.example:5433/keiro?sslmode=disable",
                "t1"
            ),
            "postgres://u:pw@db.example:5433/t1?sslmode=disable"
        );
        assert_eq!(
            with_database(
                "postgresql://u@h/keiro?dbname=other&application_name=x",
                "t1"
            ),
            "postgresql://u@h/t1?application_name=x"
        );
        assert_eq!(with_database("postgres://h", "t1"), "postgres://h/t1");
        assert_eq!(
            with_database("postgres://h:5432?x=1", "t1"),
            "postgres://h:5432/t1?x=1"
        );
    }

    #[test]
    fn replaces_the_database_of_a_url() {
        assert_eq!(
            with_database("postgres:///keiro_test", "x"),
            "postgres:///x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/db?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
    }
}
