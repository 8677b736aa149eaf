//! Listing instances for operators: filtered, in keyset pages on
//! `(created_at, id)`, so a page costs the same wherever it starts and a
//! listing visits every matching row once even while instances are added.

use crate::rows::FromRow;
use crate::sql::INSTANCE_COLUMNS;
use crate::{InstanceRow, InstanceStatus, Result, Store, StoreError};

/// Which instances [`Store::list_instances`] returns, and where it starts.
#[derive(Debug, Clone, Default)]
pub struct ListQuery<'a> {
    /// Only these statuses (all when empty).
    pub statuses: &'a [InstanceStatus],
    /// Only this workflow name.
    pub name: Option<&'a str>,
    /// Only ids starting with this.
    pub id_prefix: Option<&'a str>,
    /// Only children of this instance.
    pub parent_id: Option<&'a str>,
    /// Created at or after / before this time (µs since the Unix epoch).
    pub created_after: Option<i64>,
    /// See [`ListQuery::created_after`].
    pub created_before: Option<i64>,
    /// Last changed at or after / before this time (µs).
    pub updated_after: Option<i64>,
    /// See [`ListQuery::updated_after`].
    pub updated_before: Option<i64>,
    /// Only instances whose lease this executor holds.
    pub executor: Option<&'a str>,
    /// Oldest first (default: newest first).
    pub oldest_first: bool,
    /// Continue after this `(created_at, id)` (the last row of the previous
    /// page), in the listing's order.
    pub after: Option<(i64, &'a str)>,
    /// At most this many rows.
    pub limit: i64,
}

impl Store {
    /// The instances `query` selects, in its order, at most `query.limit`.
    pub async fn list_instances(&self, query: &ListQuery<'_>) -> Result<Vec<InstanceRow>> {
        const OP: &str = "list_instances";
        let table = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "keiro_workflows",
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "keiro.workflows",
        };
        let mut conditions: Vec<String> = Vec::new();
        let mut texts: Vec<(usize, String)> = Vec::new();
        let mut ints: Vec<(usize, i64)> = Vec::new();
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        if !query.statuses.is_empty() {
            let slots: Vec<String> = query
                .statuses
                .iter()
                .map(|status| {
                    let k = next();
                    texts.push((k, status.as_str().to_owned()));
                    format!("${k}")
                })
                .collect();
            conditions.push(format!("status IN ({})", slots.join(", ")));
        }
        let mut text = |condition: &str, value: Option<&str>| {
            if let Some(value) = value {
                let k = next();
                texts.push((k, value.to_owned()));
                conditions.push(condition.replace("$?", &format!("${k}")));
            }
        };
        text("name = $?", query.name);
        text("parent_id = $?", query.parent_id);
        text("lease_owner = $?", query.executor);
        if let Some(prefix) = query.id_prefix {
            // A prefix compare, not LIKE: `%` and `_` in ids need no escaping.
            let k = next();
            texts.push((k, prefix.to_owned()));
            conditions.push(format!("substr(id, 1, {}) = ${k}", prefix.chars().count()));
        }
        let mut int = |condition: &str, value: Option<i64>| {
            if let Some(value) = value {
                let k = next();
                ints.push((k, value));
                conditions.push(condition.replace("$?", &format!("${k}")));
            }
        };
        int("created_at >= $?", query.created_after);
        int("created_at < $?", query.created_before);
        int("updated_at >= $?", query.updated_after);
        int("updated_at < $?", query.updated_before);
        let (cmp, order) = if query.oldest_first {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        if let Some((created, id)) = query.after {
            let (kc, ki) = (next(), next());
            ints.push((kc, created));
            texts.push((ki, id.to_owned()));
            conditions.push(format!(
                "(created_at {cmp} ${kc} OR (created_at = ${kc} AND id {cmp} ${ki}))"
            ));
        }
        let kl = next();
        ints.push((kl, query.limit));
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        let sql = format!(
            "SELECT {INSTANCE_COLUMNS} FROM {table} {filter} \
             ORDER BY created_at {order}, id {order} LIMIT ${kl}"
        );
        // Bind in placeholder order.
        let mut binds: Vec<(usize, Result<i64, String>)> = texts
            .into_iter()
            .map(|(k, v)| (k, Err(v)))
            .chain(ints.into_iter().map(|(k, v)| (k, Ok(v))))
            .collect();
        binds.sort_by_key(|(k, _)| *k);
        dispatch!(Store, self, |s| {
            let mut q = sqlx::query(&sql);
            for (_, value) in &binds {
                q = match value {
                    Ok(int) => q.bind(*int),
                    Err(text) => q.bind(text.as_str()),
                };
            }
            let rows = q.fetch_all(s.pool()).await.map_err(StoreError::query(OP))?;
            rows.iter().map(InstanceRow::from_row).collect()
        })
    }
}
