//! Debounce: what a call asked with
//! [`WorkflowCall::debounce`](crate::WorkflowCall::debounce) and
//! [`WorkflowCall::max_wait`](crate::WorkflowCall::max_wait), and the checks
//! that refuse combinations with no clear meaning.

use std::time::Duration;

use crate::queue::QueueCall;
use crate::{Error, Result};

/// The debounce settings of one call.
#[derive(Debug, Clone, Default)]
pub(crate) struct DebounceCall {
    /// The burst's key and the quiet time that ends it.
    pub(crate) debounce: Option<(String, Duration)>,
    /// The longest a burst's instance waits after the burst's first call.
    pub(crate) max_wait: Option<Duration>,
}

impl DebounceCall {
    /// Whether the call asked for any debounce setting.
    pub(crate) fn is_set(&self) -> bool {
        self.debounce.is_some() || self.max_wait.is_some()
    }

    /// Refuses starting or awaiting a debounced call (`how` says which):
    /// only an enqueue can wait for the burst to end.
    pub(crate) fn refuse_run(&self, workflow: &str, how: &str) -> Result<()> {
        if !self.is_set() {
            return Ok(());
        }
        Err(Error::invalid_option(
            "WorkflowCall::debounce",
            format!(
                "workflow `{workflow}` was given `.debounce(..)` or `.max_wait(..)` but {how}, \
                 which runs it at once in this process; call `.enqueue()` and wait on the \
                 handle's `result()` instead"
            ),
        ))
    }

    /// The store's view of the settings, after refusing misuse: `id_given`
    /// when the call chose its own id, `in_workflow` when it is made inside
    /// a workflow, `queue` its queue settings.
    pub(crate) fn debounced(
        &self,
        workflow: &str,
        id_given: bool,
        in_workflow: bool,
        queue: &QueueCall,
    ) -> Result<keiro_store::Debounce<'_>> {
        let invalid = |option: &'static str, reason: String| {
            Err(Error::invalid_option(
                option,
                format!("workflow `{workflow}` {reason}"),
            ))
        };
        let Some((key, delay)) = &self.debounce else {
            return invalid(
                "WorkflowCall::max_wait",
                "was given `.max_wait(..)` without `.debounce(key, delay)`; max_wait bounds a \
                 debounced burst, so call `.debounce(..)` first"
                    .to_owned(),
            );
        };
        if key.is_empty() {
            return invalid(
                "WorkflowCall::debounce",
                "was given an empty debounce key; give the key the calls of one burst share \
                 (a user id, a document id)"
                    .to_owned(),
            );
        }
        Error::check_id("debounce key", key)?;
        if delay.is_zero() {
            return invalid(
                "WorkflowCall::debounce",
                "was given a debounce delay of zero, which would start every call at once; \
                 give the quiet time that ends a burst"
                    .to_owned(),
            );
        }
        if let Some(max_wait) = self.max_wait {
            if max_wait < *delay {
                return invalid(
                    "WorkflowCall::max_wait",
                    format!(
                        "was given `.max_wait({max_wait:?})` shorter than its debounce delay \
                         {delay:?}; max_wait must be at least the delay"
                    ),
                );
            }
        }
        if id_given {
            return invalid(
                "WorkflowCall::debounce",
                "was given both `.id(..)` and `.debounce(..)`; a debounced burst chooses its \
                 instance's id (every call of the burst gets the same one), so leave `.id(..)` \
                 out"
                .to_owned(),
            );
        }
        if in_workflow {
            return invalid(
                "WorkflowCall::debounce",
                "was debounced inside a workflow, where a call is a journaled child with an id \
                 of its own; debounce from outside workflows (a request handler), or from a \
                 `#[step]` body (a retry of the step extends the burst while it is open)"
                    .to_owned(),
            );
        }
        if queue.delay.is_some() {
            return invalid(
                "WorkflowCall::debounce",
                "was given both `.delay(..)` and `.debounce(..)`; the debounce delay already \
                 says when the instance starts, so leave `.delay(..)` out"
                    .to_owned(),
            );
        }
        if queue.dedup.is_some() {
            return invalid(
                "WorkflowCall::debounce",
                "was given both `.dedup(..)` and `.debounce(..)`; a burst already folds its \
                 calls into one instance, so leave `.dedup(..)` out"
                    .to_owned(),
            );
        }
        Ok(keiro_store::Debounce {
            key,
            delay_us: crate::time::duration_us(*delay).max(1),
            max_wait_us: self.max_wait.map(crate::time::duration_us),
            deadline_after_start_us: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(key: &str, delay_ms: u64, max_wait_ms: Option<u64>) -> DebounceCall {
        DebounceCall {
            debounce: Some((key.to_owned(), Duration::from_millis(delay_ms))),
            max_wait: max_wait_ms.map(Duration::from_millis),
        }
    }

    fn refusal(call: &DebounceCall, id_given: bool, queue: &QueueCall) -> (&'static str, String) {
        match call.debounced("sync_profile", id_given, false, queue) {
            Err(Error::InvalidOption { option, reason }) => (option, reason),
            other => panic!("expected InvalidOption, got {other:?}"),
        }
    }

    #[test]
    fn misuse_is_refused_naming_the_workflow_and_option() {
        let plain = QueueCall::default();
        let cases = [
            (
                call("", 100, None),
                false,
                "WorkflowCall::debounce",
                "empty",
            ),
            (call("k", 0, None), false, "WorkflowCall::debounce", "zero"),
            (
                call("k", 100, Some(50)),
                false,
                "WorkflowCall::max_wait",
                "shorter",
            ),
            (call("k", 100, None), true, "WorkflowCall::debounce", ".id("),
        ];
        for (call, id_given, option, what) in cases {
            let (got, reason) = refusal(&call, id_given, &plain);
            assert_eq!(got, option, "{reason}");
            assert!(
                reason.contains("`sync_profile`") && reason.contains(what),
                "{reason}"
            );
        }
        let no_key = DebounceCall {
            debounce: None,
            max_wait: Some(Duration::from_secs(1)),
        };
        assert_eq!(refusal(&no_key, false, &plain).0, "WorkflowCall::max_wait");
        let delayed = QueueCall {
            delay: Some(Duration::from_secs(1)),
            ..QueueCall::default()
        };
        let (_, reason) = refusal(&call("k", 100, None), false, &delayed);
        assert!(reason.contains(".delay("), "{reason}");
    }

    #[test]
    fn a_valid_call_becomes_the_stores_debounce() {
        let call = call("user-7", 2_000, Some(30_000));
        let debounce = call
            .debounced("sync_profile", false, false, &QueueCall::default())
            .unwrap();
        assert_eq!(debounce.key, "user-7");
        assert_eq!(debounce.delay_us, 2_000_000);
        assert_eq!(debounce.max_wait_us, Some(30_000_000));
    }
}
