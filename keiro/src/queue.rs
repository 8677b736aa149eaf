//! Queues: named pools of enqueued instances with their own limits,
//! declared with [`queue!`](crate::queue!) and chosen per call with
//! [`WorkflowCall::queue`](crate::WorkflowCall::queue).
//!
//! Every limit holds per partition key ([`WorkflowCall::partition`](crate::WorkflowCall::partition);
//! one shared partition when none is given):
//!
//! - `concurrency`: at most N of the queue's instances running (leased) at
//!   once across all worker processes, enforced in the claim itself (on
//!   PostgreSQL under a per-queue advisory lock, so claims from many
//!   processes never overshoot one another; an instance counts while its
//!   lease holds, and a run whose lease lapsed gives its slot up: see the
//!   README's Queues section for the windows that remain);
//! - `worker_concurrency`: at most N running under one worker process's
//!   lease (its runtime's executor identity: a process with two runtimes
//!   counts each apart);
//! - `rate_limit = (n, period)`: at most n first starts within any `period`
//!   (a sliding window, counted from the claim times the store records; on
//!   PostgreSQL by the server's clock, so workers whose clocks differ count
//!   one window).
//!
//! A suspended instance (sleeping, awaiting a child or a message) gives up
//! its lease and so holds no slot; when it is due again it waits for a slot
//! of the concurrency limits, and not for the rate limit (it is no second
//! start). Only resume workers
//! whose binary declares the queue claim its instances, each applying the
//! limits its binary declares.

use std::time::Duration;

use crate::{Error, Result};

/// A queue declared with [`queue!`](crate::queue!), registered at link time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    name: &'static str,
    concurrency: Option<u32>,
    worker_concurrency: Option<u32>,
    rate_limit: Option<(u32, Duration)>,
}

impl Queue {
    /// Used by [`queue!`](crate::queue!).
    #[doc(hidden)]
    pub const fn __new(
        name: &'static str,
        concurrency: Option<u32>,
        worker_concurrency: Option<u32>,
        rate_limit: Option<(u32, Duration)>,
    ) -> Queue {
        Queue {
            name,
            concurrency,
            worker_concurrency,
            rate_limit,
        }
    }

    /// The queue's name, as stored with its instances.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// At most this many of its instances running at once across all workers.
    pub fn concurrency(&self) -> Option<u32> {
        self.concurrency
    }

    /// At most this many running at once in one worker process.
    pub fn worker_concurrency(&self) -> Option<u32> {
        self.worker_concurrency
    }

    /// At most `.0` starts within any `.1` (a sliding window).
    pub fn rate_limit(&self) -> Option<(u32, Duration)> {
        self.rate_limit
    }

    /// Refuses settings the macro could not see (computed from constants).
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Error::InvalidOption {
            option: "queue!",
            reason,
        };
        if self.name.trim().is_empty() {
            return Err(invalid(format!(
                "a queue's name is empty or blank ({:?}); name it",
                self.name
            )));
        }
        if let Err(error) = Error::check_id("queue name", self.name) {
            return Err(invalid(error.to_string()));
        }
        let zero = |what: &str| {
            invalid(format!(
                "queue `{}` has {what} 0, which would never run anything; \
                 use at least 1 or leave it out for no limit",
                self.name
            ))
        };
        if self.concurrency == Some(0) {
            return Err(zero("concurrency"));
        }
        if self.worker_concurrency == Some(0) {
            return Err(zero("worker_concurrency"));
        }
        // Refused at compile time when both are literals; from constants
        // only warned of, so a deploy that changes one does not stop the
        // runtime from connecting: the per-worker limit is merely redundant.
        if let (Some(all), Some(per_worker)) = (self.concurrency, self.worker_concurrency) {
            if per_worker > all {
                tracing::warn!(
                    queue = self.name,
                    "queue `{}` has worker_concurrency {per_worker} above its concurrency \
                     {all}, so it never limits anything; lower it to at most {all} or leave it \
                     out",
                    self.name
                );
            }
        }
        if let Some((starts, period)) = self.rate_limit {
            if starts == 0 {
                return Err(zero("a rate_limit of"));
            }
            if period.is_zero() {
                return Err(invalid(format!(
                    "queue `{}` has a rate_limit period of zero; give it a positive Duration",
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// Its limits in words, as a worker registers them so that one
    /// declaring the queue otherwise can tell: `concurrency 10,
    /// worker_concurrency 2, rate_limit 100 per 60s`, or `no limits`.
    pub(crate) fn describe_limits(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.concurrency {
            parts.push(format!("concurrency {n}"));
        }
        if let Some(n) = self.worker_concurrency {
            parts.push(format!("worker_concurrency {n}"));
        }
        if let Some((starts, period)) = self.rate_limit {
            parts.push(format!("rate_limit {starts} per {period:?}"));
        }
        match parts.is_empty() {
            true => "no limits".to_owned(),
            false => parts.join(", "),
        }
    }

    /// The rate limit (starts, period) a worker registered in `limits`, the
    /// text [`Queue::describe_limits`] wrote (its period as `Duration`
    /// prints it, e.g. `60s`, `1.5s`, `250ms`); `None` without one, or for
    /// text it cannot read.
    pub(crate) fn registered_rate_limit(limits: &str) -> Option<(u32, Duration)> {
        let rate = limits
            .split(", ")
            .find_map(|part| part.strip_prefix("rate_limit "))?;
        let (starts, period) = rate.split_once(" per ")?;
        let split = period.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, unit) = period.split_at(split);
        let unit_ns: u128 = match unit {
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "µs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        // Exact: whole units, then the fraction's digits (at most nine).
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() || fraction.len() > 9 {
            return None;
        }
        let whole: u128 = whole.parse().ok()?;
        let mut nanos = whole.checked_mul(unit_ns)?;
        if !fraction.is_empty() {
            let digits: u128 = fraction.parse().ok()?;
            let scale = 10u128.pow(fraction.len() as u32);
            nanos = nanos.checked_add(digits * unit_ns / scale)?;
        }
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        let period = Duration::new(secs, (nanos % 1_000_000_000) as u32);
        Some((starts.parse().ok()?, period))
    }

    /// The limits as the store's claim applies them.
    pub(crate) fn limits(&self) -> keiro_store::QueueLimits<'static> {
        keiro_store::QueueLimits {
            name: self.name,
            concurrency: self.concurrency.map(i64::from),
            worker_concurrency: self.worker_concurrency.map(i64::from),
            rate_limit: self.rate_limit.map(|(starts, period)| {
                (i64::from(starts), crate::time::duration_us(period).max(1))
            }),
        }
    }
}

/// One [`queue!`](crate::queue!) declaration, submitted through `inventory`.
#[derive(Debug)]
#[doc(hidden)]
pub struct QueueRegistration {
    /// The declared queue.
    pub queue: &'static Queue,
}

inventory::collect!(QueueRegistration);

/// The queues linked into this binary, validated, sorted by name: two
/// declarations of one name must agree on every setting.
pub(crate) fn collect() -> Result<Vec<&'static Queue>> {
    from_iter(
        inventory::iter::<QueueRegistration>
            .into_iter()
            .map(|r| r.queue),
    )
}

fn from_iter(queues: impl IntoIterator<Item = &'static Queue>) -> Result<Vec<&'static Queue>> {
    let mut all: Vec<&'static Queue> = Vec::new();
    for queue in queues {
        queue.validate()?;
        match all.iter().find(|q| q.name == queue.name) {
            Some(previous) if *previous != queue => {
                return Err(Error::InvalidOption {
                    option: "queue!",
                    reason: format!(
                        "queue `{}` is declared twice with different settings ({previous:?} and \
                         {queue:?}); declare it once and share the static",
                        queue.name
                    ),
                })
            }
            Some(_) => {}
            None => all.push(queue),
        }
    }
    all.sort_unstable_by_key(|q| q.name);
    Ok(all)
}

/// What a call asked of its queue ([`WorkflowCall::queue`](crate::WorkflowCall::queue) and the
/// settings after it).
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueCall {
    pub(crate) queue: Option<&'static Queue>,
    pub(crate) priority: Option<i64>,
    pub(crate) partition: Option<String>,
    pub(crate) dedup: Option<String>,
    pub(crate) delay: Option<Duration>,
}

impl QueueCall {
    /// Whether the call asked for anything beyond the default queue.
    pub(crate) fn is_set(&self) -> bool {
        self.queue.is_some() || self.delay.is_some() || self.needs_queue().is_some()
    }

    /// The first setting given that only a named queue has.
    fn needs_queue(&self) -> Option<&'static str> {
        [
            (self.priority.is_some(), "priority"),
            (self.partition.is_some(), "partition"),
            (self.dedup.is_some(), "dedup"),
        ]
        .into_iter()
        .find_map(|(set, what)| set.then_some(what))
    }

    /// The store's view: on which queue, how, and not before when (from
    /// `now_us`, the runtime clock). Refuses queue settings without a queue.
    pub(crate) fn queued<'a>(
        &'a self,
        workflow: &str,
        now_us: i64,
    ) -> Result<keiro_store::Queued<'a>> {
        if let (None, Some(what)) = (self.queue, self.needs_queue()) {
            return Err(Error::InvalidOption {
                option: "WorkflowCall::queue",
                reason: format!(
                    "workflow `{workflow}` was given `.{what}(..)` without `.queue(&QUEUE)`; \
                     the default queue has no {what}s: declare a queue with keiro::queue! and \
                     call `.queue(&QUEUE)` first"
                ),
            });
        }
        if let Some(partition) = &self.partition {
            Error::check_id("queue partition key", partition)?;
        }
        if let Some(dedup) = &self.dedup {
            Error::check_id("queue dedup key", dedup)?;
        }
        Ok(keiro_store::Queued {
            queue: self.queue.map(Queue::name),
            priority: self.priority.unwrap_or(0),
            partition: self.partition.as_deref().unwrap_or(""),
            dedup: self.dedup.as_deref(),
            not_before: self
                .delay
                .map(|d| now_us.saturating_add(crate::time::duration_us(d))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: Queue = Queue::__new("mail", Some(2), None, None);
    static B: Queue = Queue::__new("mail", Some(3), None, None);
    static ZERO: Queue = Queue::__new("zero", None, Some(0), None);

    #[test]
    fn one_name_with_two_settings_is_refused_naming_the_queue() {
        let text = from_iter([&A, &B]).unwrap_err().to_string();
        assert!(text.contains("`mail`") && text.contains("twice"), "{text}");
        assert_eq!(from_iter([&A, &A]).unwrap().len(), 1);
    }

    #[test]
    fn a_registered_rate_limit_reads_back() {
        for period in [
            Duration::from_secs(60),
            Duration::from_millis(1500),
            Duration::from_millis(250),
            Duration::from_micros(70),
            Duration::from_nanos(3),
            Duration::from_secs(86_400 * 7),
            Duration::new(1, 1),
            Duration::new(200 * 86_400, 123_456_789),
            Duration::MAX,
        ] {
            let queue = Queue::__new("rated", Some(4), Some(2), Some((100, period)));
            let limits = queue.describe_limits();
            let (starts, read) = Queue::registered_rate_limit(&limits).unwrap();
            assert_eq!(starts, 100, "{limits}");
            assert_eq!(read, period, "{limits}");
        }
        assert_eq!(Queue::registered_rate_limit("concurrency 3"), None);
        assert_eq!(Queue::registered_rate_limit("no limits"), None);
        assert_eq!(Queue::registered_rate_limit("rate_limit 5 per soon"), None);
    }

    #[test]
    fn a_zero_limit_is_refused_naming_the_queue() {
        let text = from_iter([&ZERO]).unwrap_err().to_string();
        assert!(
            text.contains("`zero`") && text.contains("worker_concurrency"),
            "{text}"
        );
    }

    #[test]
    fn settings_the_macro_could_not_see_are_refused_naming_the_problem() {
        let refused = |queue: Queue| {
            let error = queue.validate().unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::InvalidOption {
                        option: "queue!",
                        ..
                    }
                ),
                "{error:?}"
            );
            error.to_string()
        };
        let text = refused(Queue::__new("  ", None, None, None));
        assert!(text.contains("blank"), "{text}");
        let text = refused(Queue::__new("a\0b", None, None, None));
        assert!(text.contains("NUL"), "{text}");
        // Redundant, not wrong: connects (with a warning).
        Queue::__new("mail", Some(2), Some(3), None)
            .validate()
            .unwrap();
        let text = refused(Queue::__new("mail", None, None, Some((5, Duration::ZERO))));
        assert!(text.contains("period of zero"), "{text}");
        Queue::__new("mail", Some(3), Some(3), Some((5, Duration::from_secs(1))))
            .validate()
            .unwrap();
    }
}
