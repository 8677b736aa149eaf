//! Read-only inspection: pending, stuck and dead timers, page by page.
//!
//! Pages are keyset pages over `(sort key, id)`: pending timers by fire time,
//! stuck ones by claim time, dead ones by the time they were dead-lettered.
//! A row's place depends only on its own key, so timers inserted while a
//! caller pages never shift the rows already seen: every row present
//! throughout is visited exactly once.

use std::time::Duration;

use keiro_store::{ReasonMatch, TimerListKind, TimerQuery};

use super::{TimerError, TimerRow, Timers};
use crate::time::duration_us;

/// The largest page [`Timers::pending`], [`Timers::stuck`] and
/// [`Timers::dead`] serve.
pub const MAX_PAGE_LIMIT: u32 = 500;

/// The three timer listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimerList {
    /// Scheduled timers waiting for their fire time, earliest first.
    Pending,
    /// Timers claimed by a worker that has not finished them, oldest claim first.
    Stuck,
    /// Dead-lettered timers, in the order they died.
    Dead,
}

impl TimerList {
    fn tag(self) -> &'static str {
        match self {
            TimerList::Pending => "kt1p",
            TimerList::Stuck => "kt1s",
            TimerList::Dead => "kt1d",
        }
    }
}

impl std::fmt::Display for TimerList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimerList::Pending => "pending",
            TimerList::Stuck => "stuck",
            TimerList::Dead => "dead",
        })
    }
}

/// How a timer's latest diagnostic (its dead-letter reason or retry note) must read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerReasonFilter {
    /// Exactly this text.
    Exact(String),
    /// Containing this text (case-sensitive, no wildcards).
    Contains(String),
}

/// Which timers of a listing to return. The default matches every timer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerFilter {
    /// Only this process manager's timers.
    pub process_manager: Option<String>,
    /// Only timers whose latest diagnostic matches.
    pub reason: Option<TimerReasonFilter>,
}

/// One page to read: a filter, a size and where the previous page ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerPageRequest {
    /// Which timers.
    pub filter: TimerFilter,
    /// At most this many (1 to [`MAX_PAGE_LIMIT`]).
    pub limit: u32,
    /// The previous page's [`TimerPage::next_cursor`]; `None` for the first page.
    pub cursor: Option<String>,
}

impl TimerPageRequest {
    /// The first page of `limit` timers, unfiltered.
    pub fn first(limit: u32) -> TimerPageRequest {
        TimerPageRequest {
            filter: TimerFilter::default(),
            limit,
            cursor: None,
        }
    }

    /// The same request restricted by `filter`.
    pub fn filter(mut self, filter: TimerFilter) -> TimerPageRequest {
        self.filter = filter;
        self
    }

    /// The same request continuing after `cursor`.
    pub fn after(mut self, cursor: impl Into<String>) -> TimerPageRequest {
        self.cursor = Some(cursor.into());
        self
    }
}

/// One page of timers.
#[derive(Debug, Clone, PartialEq)]
pub struct TimerPage {
    /// The timers, in the listing's order.
    pub items: Vec<TimerRow>,
    /// Where the next page starts, or `None` when this was the last. Opaque:
    /// pass it back as [`TimerPageRequest::cursor`] of the same listing.
    pub next_cursor: Option<String>,
}

impl Timers {
    /// A page of scheduled timers waiting for their fire time, earliest first.
    pub async fn pending(&self, request: &TimerPageRequest) -> Result<TimerPage, TimerError> {
        self.page(
            TimerList::Pending,
            TimerListKind::Pending { due_by: None },
            request,
        )
        .await
    }

    /// A page of timers a worker claimed at least `older_than` ago and has not
    /// finished (its fire action is slow, or its process died), oldest claim
    /// first. A worker with `requeue_stuck_after` set requeues these.
    pub async fn stuck(
        &self,
        older_than: Duration,
        request: &TimerPageRequest,
    ) -> Result<TimerPage, TimerError> {
        let claimed_by = self.store.now_us().saturating_sub(duration_us(older_than));
        self.page(
            TimerList::Stuck,
            TimerListKind::Stuck { claimed_by },
            request,
        )
        .await
    }

    /// A page of dead-lettered timers, in the order they died.
    pub async fn dead(&self, request: &TimerPageRequest) -> Result<TimerPage, TimerError> {
        self.page(TimerList::Dead, TimerListKind::Dead, request)
            .await
    }

    async fn page(
        &self,
        list: TimerList,
        kind: TimerListKind,
        request: &TimerPageRequest,
    ) -> Result<TimerPage, TimerError> {
        if request.limit == 0 || request.limit > MAX_PAGE_LIMIT {
            return Err(TimerError::InvalidPageLimit {
                limit: request.limit,
                max: MAX_PAGE_LIMIT,
            });
        }
        let after = request
            .cursor
            .as_deref()
            .map(|c| decode_cursor(list, c))
            .transpose()?;
        let reason = request.filter.reason.as_ref().map(|r| match r {
            TimerReasonFilter::Exact(text) => ReasonMatch::Exact(text),
            TimerReasonFilter::Contains(text) => ReasonMatch::Contains(text),
        });
        let query = TimerQuery {
            kind,
            process_manager: request.filter.process_manager.as_deref(),
            reason,
            after: after.as_ref().map(|(key, id)| (*key, id.as_str())),
            // One row more than asked tells whether another page follows.
            limit: i64::from(request.limit) + 1,
        };
        let mut records = self.store.find_timers(&query).await?;
        let more = records.len() > request.limit as usize;
        records.truncate(request.limit as usize);
        let next_cursor = match records.last() {
            Some(last) if more => Some(encode_cursor(
                list,
                keiro_store::timer_sort_key(kind, last),
                &last.id,
            )),
            _ => None,
        };
        let items = records
            .into_iter()
            .map(TimerRow::from_record)
            .collect::<Result<_, _>>()?;
        Ok(TimerPage { items, next_cursor })
    }
}

fn encode_cursor(list: TimerList, key: i64, id: &str) -> String {
    let mut out = format!("{}.{key}.", list.tag());
    for byte in id.bytes() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn decode_cursor(expected: TimerList, cursor: &str) -> Result<(i64, String), TimerError> {
    let malformed = || TimerError::MalformedCursor {
        cursor: cursor.to_owned(),
    };
    let mut parts = cursor.split('.');
    let (Some(tag), Some(key), Some(id), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed());
    };
    let found = [TimerList::Pending, TimerList::Stuck, TimerList::Dead]
        .into_iter()
        .find(|l| l.tag() == tag)
        .ok_or_else(malformed)?;
    let key: i64 = key.parse().map_err(|_| malformed())?;
    if id.len() % 2 != 0 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed());
    }
    let bytes = (0..id.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&id[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| malformed())?;
    let id = String::from_utf8(bytes).map_err(|_| malformed())?;
    if found != expected {
        return Err(TimerError::WrongCursorKind { expected, found });
    }
    Ok((key, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_the_wrong_listing() {
        let cursor = encode_cursor(TimerList::Dead, 1_700_000_000_123, "order-42/timeout.é");
        assert_eq!(
            decode_cursor(TimerList::Dead, &cursor).unwrap(),
            (1_700_000_000_123, "order-42/timeout.é".to_owned())
        );
        assert!(matches!(
            decode_cursor(TimerList::Pending, &cursor),
            Err(TimerError::WrongCursorKind {
                expected: TimerList::Pending,
                found: TimerList::Dead
            })
        ));
        for bad in [
            "",
            "kt1d",
            "kt1d.12",
            "kt1d.x.00",
            "kt1d.1.0",
            "kt1d.1.zz",
            "kt9d.1.61",
            "kt1d.1.61.62",
            "kt1d.1.ff",
        ] {
            assert!(
                matches!(
                    decode_cursor(TimerList::Dead, bad),
                    Err(TimerError::MalformedCursor { .. })
                ),
                "{bad:?} is malformed"
            );
        }
    }
}
