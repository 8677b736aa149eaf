//! The timer module's error type.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keiro_store::{StoreError, TimerStatus};

use super::{TimerAction, TimerList};

/// What can go wrong scheduling, firing, inspecting or resuming timers.
///
/// [`TimerError::is_transient`] tells a store hiccup or a clock that is off
/// (retry later) from a refusal (fix the call): every variant but
/// [`TimerError::Store`] and [`TimerError::ClockSkew`] is a refusal, and
/// nothing was changed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TimerError {
    /// The store could not be reached or a statement failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A timer worker option is out of range; the worker did not start.
    #[error("invalid timer worker option `{option}`: {reason}")]
    InvalidOption {
        /// The option, e.g. `max_attempts`.
        option: &'static str,
        /// What is wrong with its value and what to use instead.
        reason: String,
    },
    /// A timer request cannot be scheduled as given.
    #[error("cannot schedule timer `{id}`: {reason}")]
    InvalidRequest {
        /// The timer id.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A timer's payload is larger than the configured limit
    /// ([`crate::KeiroBuilder::max_payload_bytes`],
    /// [`crate::timers::Timers::max_payload_bytes`]); nothing was written.
    #[error(
        "the payload of timer `{id}` (process manager `{process_manager}`) is {size} bytes, over \
         the limit of {limit}; store large data elsewhere and put its key in the payload"
    )]
    PayloadTooLarge {
        /// The timer id.
        id: String,
        /// The process manager the timer belongs to.
        process_manager: String,
        /// The payload's encoded length in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A timer's payload is not the JSON its reader expects.
    #[error("the payload of timer `{id}` does not decode: {source}")]
    Payload {
        /// The timer id.
        id: String,
        /// The JSON error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A page was asked for with a limit outside `1..=max`.
    #[error("a timer page limit of {limit} is out of range; ask for 1 to {max} timers a page")]
    InvalidPageLimit {
        /// The limit asked for.
        limit: u32,
        /// The largest page served.
        max: u32,
    },
    /// A page cursor is not one this module handed out.
    #[error("`{cursor}` is not a timer page cursor; pass the `next_cursor` of a previous page")]
    MalformedCursor {
        /// The cursor given.
        cursor: String,
    },
    /// A page cursor of one listing was passed to another.
    #[error(
        "this cursor pages through {found} timers, not {expected} timers; start the {expected} \
         listing without a cursor"
    )]
    WrongCursorKind {
        /// The listing asked for.
        expected: TimerList,
        /// The listing the cursor came from.
        found: TimerList,
    },
    /// No timer has this id.
    #[error("no timer has id `{id}`")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// An id-only mutation met a timer held by a guarded foreground resume
    /// claim: only the claim's holder may move it until the claim ends or
    /// lapses.
    #[error(
        "timer `{id}` is held by a foreground resume claim until {lease_until:?}; only the \
         claim's holder may change it (or wait for the claim to lapse)"
    )]
    HeldForResume {
        /// The timer id.
        id: String,
        /// When the claim lapses unless renewed.
        lease_until: SystemTime,
    },
    /// Only a dead timer can be claimed for a foreground resume.
    #[error("timer `{id}` is {status}, not dead; only dead timers can be resumed")]
    NotDead {
        /// The timer id.
        id: String,
        /// Its status.
        status: TimerStatus,
    },
    /// A change by id ([`TimerAction`]) does not apply to the timer's
    /// status; nothing changed.
    #[error(
        "timer `{id}` is {}; {action} takes {} timer, so nothing changed",
        status.as_str(),
        action.takes()
    )]
    NotApplicable {
        /// The timer id.
        id: String,
        /// The change asked for.
        action: TimerAction,
        /// The status that refused it.
        status: TimerStatus,
    },
    /// The resume claim's lease is out of range.
    #[error("a resume lease of {lease:?} is out of range; use more than zero and at most {max:?}")]
    InvalidLease {
        /// The lease asked for.
        lease: Duration,
        /// The longest lease granted.
        max: Duration,
    },
    /// The resume claim no longer holds the timer: it lapsed (and may have been
    /// recovered to dead or claimed by someone else), or it was already ended.
    #[error(
        "the resume claim on timer `{id}` no longer holds it (the timer is {}); claim it again",
        status.map_or("gone", TimerStatus::as_str)
    )]
    ResumeClaimLost {
        /// The timer id.
        id: String,
        /// The timer's status now, `None` when it is gone.
        status: Option<TimerStatus>,
    },
    /// This process's clock is further from the database server's than
    /// [`super::Timers::max_clock_skew`] allows (PostgreSQL):
    /// [`super::Timers::run_once`] and [`super::Timers::drain`] claimed
    /// nothing and requeued nothing. Transient: the clock is read again at
    /// most 2.5 s later, and calls go on once it is back.
    #[error(
        "this process's clock is {} the database server's, more than max_clock_skew ({limit:?}) \
         allows, so no timer was claimed: timers fall due by the claiming worker's clock, so \
         they would fire early or late, and fires still running elsewhere would be requeued and \
         fire twice; synchronise this host's clock (NTP)",
        crate::error::clock_offset_words(*.offset_ms)
    )]
    ClockSkew {
        /// This process's clock minus the server's, in ms: positive when it
        /// runs ahead.
        offset_ms: i64,
        /// The limit it is beyond.
        limit: Duration,
    },
    /// A resume token is not one this module handed out.
    #[error("`{token}` is not a timer resume token")]
    MalformedResumeToken {
        /// The token given.
        token: String,
    },
}

impl TimerError {
    /// Whether trying again later may succeed: the store was unreachable or
    /// busy, or this process's clock was off the server's.
    pub fn is_transient(&self) -> bool {
        match self {
            TimerError::Store(e) => e.is_transient(),
            TimerError::ClockSkew { .. } => true,
            _ => false,
        }
    }
}
