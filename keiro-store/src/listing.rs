//! Listing instances for operators: filtered, in keyset pages on
//! `(created_at, id)`, so a page costs the same wherever it starts and a
//! listing visits every matching row once even while instances are added.
//!
//! A status filter reads the `(status, created_at, id)` index, a name filter
//! the `(name, created_at, id)` one (migration 0012): a page is one index
//! range scan from the cursor. Several statuses are one such scan each,
//! merged (`UNION ALL` of per-status pages, then the first `limit` of the
//! union), because no index yields `status IN (..)` in creation order.

use crate::rows::{FromRow, StoreRow};
use crate::sql::INSTANCE_COLUMNS;
use crate::{InstanceRow, InstanceStatus, Result, Store, StoreError};

/// Which instances [`Store::list_instances`] returns, and where it starts.
#[derive(Debug, Clone, Default)]
pub struct ListQuery<'a> {
    /// Only these statuses (all when empty).
    pub statuses: &'a [InstanceStatus],
    /// Only this workflow name.
    pub name: Option<&'a str>,
    /// Only instances of this application version (read through the
    /// `(app_version, created_at, id)` index of migration 0014).
    pub app_version: Option<&'a str>,
    /// Only instances on this queue (`keiro::queue!` name; the default
    /// queue has none).
    pub queue: Option<&'a str>,
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

/// The journal entry a suspended instance waits on, stored when it suspends
/// ([`crate::Suspend::waiting`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingStep {
    /// The entry's seq (recorded when the wait ends; a sleep's is recorded
    /// already, holding its deadline).
    pub seq: i64,
    /// The kind of wait: `sleep`, `awakeable`, `child` or `message`.
    pub kind: String,
    /// The sleep's name, the child's workflow name or the message topic
    /// (`awakeable` for an awakeable).
    pub name: String,
}

/// An instance as [`Store::list_summaries`] reads it.
#[derive(Debug, Clone)]
pub struct ListedInstance {
    /// Its row.
    pub row: InstanceRow,
    /// What it waits on while it is suspended; `None` otherwise.
    pub waiting: Option<WaitingStep>,
    /// The queue it was enqueued on; `None`: the default queue.
    pub queue: Option<String>,
    /// The key of the debounced burst it was enqueued by; `None` when it
    /// was not debounced, or was retried, requeued or continued as new
    /// since.
    pub debounce_key: Option<String>,
}

/// The columns a listing reads besides [`INSTANCE_COLUMNS`].
const WAITING_COLUMNS: &str = "waiting_seq, waiting_kind, waiting_name, queue, debounce_key";

impl FromRow for ListedInstance {
    fn from_row(r: &impl StoreRow) -> Result<Self> {
        let row = InstanceRow::from_row(r)?;
        let what = || format!("workflow instance `{}`", row.id);
        let seq = r.maybe_int(what, "waiting_seq")?;
        let kind = r.maybe_text(what, "waiting_kind")?;
        let name = r.maybe_text(what, "waiting_name")?;
        let queue = r.maybe_text(what, "queue")?;
        let debounce_key = r.maybe_text(what, "debounce_key")?;
        // The columns keep the last suspension's wait; it holds only while
        // the instance is still suspended.
        let waiting = match (row.status, seq, kind, name) {
            (InstanceStatus::Suspended, Some(seq), Some(kind), Some(name)) => {
                Some(WaitingStep { seq, kind, name })
            }
            _ => None,
        };
        Ok(ListedInstance {
            row,
            waiting,
            queue,
            debounce_key,
        })
    }
}

/// One bound parameter of a listing.
enum Bind {
    Text(String),
    Int(i64),
}

/// The listing statement under construction: numbered placeholders and the
/// values bound to them, in order.
#[derive(Default)]
struct Statement {
    binds: Vec<Bind>,
}

impl Statement {
    /// A placeholder for `value`.
    fn bind(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("${}", self.binds.len())
    }
    fn text(&mut self, value: &str) -> String {
        self.bind(Bind::Text(value.to_owned()))
    }
    fn int(&mut self, value: i64) -> String {
        self.bind(Bind::Int(value))
    }
}

impl Store {
    /// The instances `query` selects, in its order, at most `query.limit`.
    pub async fn list_instances(&self, query: &ListQuery<'_>) -> Result<Vec<InstanceRow>> {
        let listed = self.list_summaries(query).await?;
        Ok(listed.into_iter().map(|listed| listed.row).collect())
    }

    /// Like [`Store::list_instances`], with what each suspended instance
    /// waits on.
    pub async fn list_summaries(&self, query: &ListQuery<'_>) -> Result<Vec<ListedInstance>> {
        const OP: &str = "list_instances";
        let table = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "keiro_workflows",
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "keiro.workflows",
        };
        let mut st = Statement::default();
        let mut conditions: Vec<String> = Vec::new();
        if let Some(name) = query.name {
            conditions.push(format!("name = {}", st.text(name)));
        }
        if let Some(version) = query.app_version {
            conditions.push(format!("app_version = {}", st.text(version)));
        }
        if let Some(queue) = query.queue {
            conditions.push(format!("queue = {}", st.text(queue)));
        }
        if let Some(parent) = query.parent_id {
            conditions.push(format!("parent_id = {}", st.text(parent)));
        }
        if let Some(executor) = query.executor {
            conditions.push(format!("lease_owner = {}", st.text(executor)));
        }
        if let Some(prefix) = query.id_prefix {
            // A prefix compare, not LIKE: `%` and `_` in ids need no escaping.
            let count = prefix.chars().count();
            conditions.push(format!("substr(id, 1, {count}) = {}", st.text(prefix)));
        }
        let times = [
            ("created_at >=", query.created_after),
            ("created_at <", query.created_before),
            ("updated_at >=", query.updated_after),
            ("updated_at <", query.updated_before),
        ];
        for (compare, value) in times {
            if let Some(value) = value {
                conditions.push(format!("{compare} {}", st.int(value)));
            }
        }
        let (cmp, order) = if query.oldest_first {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        if let Some((created, id)) = query.after {
            // A row-value compare: both databases bound the index range scan
            // with it (an `OR` of the two cases they would not).
            let (created, id) = (st.int(created), st.text(id));
            conditions.push(format!("(created_at, id) {cmp} ({created}, {id})"));
        }
        let limit = st.int(query.limit);
        let ordered = format!("ORDER BY created_at {order}, id {order} LIMIT {limit}");
        let columns = format!("{INSTANCE_COLUMNS}, {WAITING_COLUMNS}");
        let select = |status: Option<String>| {
            let all: Vec<&str> = status
                .iter()
                .map(String::as_str)
                .chain(conditions.iter().map(String::as_str))
                .collect();
            let filter = if all.is_empty() {
                String::new()
            } else {
                format!("WHERE {}", all.join(" AND "))
            };
            format!("SELECT {columns} FROM {table} {filter} {ordered}")
        };
        let sql = match query.statuses {
            [] => select(None),
            [one] => select(Some(format!("status = {}", st.text(one.as_str())))),
            several => {
                let mut statuses: Vec<&str> = several.iter().map(|s| s.as_str()).collect();
                statuses.sort_unstable();
                statuses.dedup();
                let pages: Vec<String> = statuses
                    .into_iter()
                    .map(|status| {
                        let page = select(Some(format!("status = {}", st.text(status))));
                        format!("SELECT * FROM ({page}) AS page")
                    })
                    .collect();
                format!(
                    "SELECT * FROM ({}) AS pages {ordered}",
                    pages.join(" UNION ALL ")
                )
            }
        };
        dispatch!(Store, self, |s| {
            let mut q = crate::prepared::query(&sql);
            for value in &st.binds {
                q = match value {
                    Bind::Int(int) => q.bind(*int),
                    Bind::Text(text) => q.bind(text.as_str()),
                };
            }
            let rows = q.fetch_all(s.exec()).await.map_err(StoreError::query(OP))?;
            rows.iter().map(ListedInstance::from_row).collect()
        })
    }

    /// Instance `id` as a listing reads it (with what it waits on), or
    /// `None` when no instance has that id.
    pub async fn get_summary(&self, id: &str) -> Result<Option<ListedInstance>> {
        const OP: &str = "get_summary";
        let table = match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "keiro_workflows",
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "keiro.workflows",
        };
        let sql =
            format!("SELECT {INSTANCE_COLUMNS}, {WAITING_COLUMNS} FROM {table} WHERE id = $1");
        dispatch!(Store, self, |s| {
            let row = crate::prepared::query(&sql)
                .bind(id)
                .fetch_optional(s.exec())
                .await
                .map_err(StoreError::query(OP))?;
            row.as_ref().map(ListedInstance::from_row).transpose()
        })
    }
}
