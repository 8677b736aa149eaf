//! The timer types callers build and read: ids, requests, rows.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keiro_store::{StoreError, TimerStatus};
use serde::de::DeserializeOwned;

use super::TimerError;
use crate::time::from_us;

/// A timer's id, chosen by whoever schedules it. Scheduling is idempotent on
/// it, so a deterministic id (`"order-42/payment-timeout"`) makes a retried
/// schedule harmless; [`TimerId::random`] makes a fresh one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(String);

impl TimerId {
    /// A timer id from any text.
    pub fn new(id: impl Into<String>) -> TimerId {
        TimerId(id.into())
    }

    /// A fresh random (UUID v4) id.
    pub fn random() -> TimerId {
        TimerId(uuid::Uuid::new_v4().to_string())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TimerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for TimerId {
    fn from(id: String) -> Self {
        TimerId(id)
    }
}

impl From<&str> for TimerId {
    fn from(id: &str) -> Self {
        TimerId(id.to_owned())
    }
}

impl From<uuid::Uuid> for TimerId {
    fn from(id: uuid::Uuid) -> Self {
        TimerId(id.to_string())
    }
}

impl AsRef<str> for TimerId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A timer to schedule: who it is for, when it is due, and what to hand the
/// fire action.
///
/// ```
/// use std::time::Duration;
/// use keiro::timers::TimerRequest;
///
/// let request = TimerRequest::after("order-42/timeout", "checkout", "order-42", Duration::from_secs(900))
///     .payload(serde_json::json!({ "reason": "payment not received" }));
/// assert_eq!(request.process_manager, "checkout");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TimerRequest {
    /// The timer's id; scheduling is idempotent on it.
    pub id: TimerId,
    /// The process manager the timer belongs to. Fire actions route on it and
    /// metrics are labelled by it, so it should come from a small, fixed set
    /// of names (never an id).
    pub process_manager: String,
    /// What the timer is about (an order, a saga, a session).
    pub correlation_id: String,
    /// When it is due. Stored with microsecond precision.
    pub fire_at: SystemTime,
    /// Handed to the fire action as [`TimerRow::payload`]. Default `null`.
    pub payload: serde_json::Value,
}

impl TimerRequest {
    /// A timer due at `fire_at` with a `null` payload.
    pub fn new(
        id: impl Into<TimerId>,
        process_manager: impl Into<String>,
        correlation_id: impl Into<String>,
        fire_at: SystemTime,
    ) -> TimerRequest {
        TimerRequest {
            id: id.into(),
            process_manager: process_manager.into(),
            correlation_id: correlation_id.into(),
            fire_at,
            payload: serde_json::Value::Null,
        }
    }

    /// A timer due `delay` from now, with a `null` payload.
    pub fn after(
        id: impl Into<TimerId>,
        process_manager: impl Into<String>,
        correlation_id: impl Into<String>,
        delay: Duration,
    ) -> TimerRequest {
        TimerRequest::new(
            id,
            process_manager,
            correlation_id,
            SystemTime::now() + delay,
        )
    }

    /// The same request carrying `payload`.
    pub fn payload(mut self, payload: serde_json::Value) -> TimerRequest {
        self.payload = payload;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), TimerError> {
        let refuse = |reason: String| {
            Err(TimerError::InvalidRequest {
                id: self.id.to_string(),
                reason,
            })
        };
        if self.id.as_str().is_empty() {
            return refuse("the timer id is empty".into());
        }
        if self.process_manager.is_empty() {
            return refuse("the process manager name is empty".into());
        }
        if self.fire_at < UNIX_EPOCH {
            return refuse("the fire time is before 1970".into());
        }
        let keys = [
            ("timer id", self.id.as_str()),
            ("timer process manager", self.process_manager.as_str()),
            ("timer correlation id", self.correlation_id.as_str()),
        ];
        for (what, value) in keys {
            if value.is_empty() {
                continue;
            }
            if let Err(StoreError::InvalidId {
                value_preview,
                reason,
                ..
            }) = keiro_store::validate_id(what, value)
            {
                return Err(TimerError::InvalidRequest {
                    id: keiro_store::preview_id(self.id.as_str()),
                    reason: format!("its {what} `{value_preview}` is refused: {reason}"),
                });
            }
        }
        Ok(())
    }
}

/// A stored timer, as a fire action and the inspection pages see it.
#[derive(Debug, Clone, PartialEq)]
pub struct TimerRow {
    /// The timer's id.
    pub id: TimerId,
    /// The process manager it belongs to.
    pub process_manager: String,
    /// What it is about.
    pub correlation_id: String,
    /// When it is (or was) due.
    pub fire_at: SystemTime,
    /// The payload it was scheduled with.
    pub payload: serde_json::Value,
    /// Where it stands.
    pub status: TimerStatus,
    /// How many times a worker has claimed it, this claim included for a row
    /// handed to a fire action.
    pub attempts: u32,
    /// The latest diagnostic: a retry note or the dead-letter reason.
    pub last_error: Option<String>,
    /// The event its firing produced, once fired.
    pub event_id: Option<String>,
    /// When the current (or last) worker claim was taken.
    pub claimed_at: Option<SystemTime>,
    /// While a foreground resume holds it: when that claim lapses.
    pub resume_lease_until: Option<SystemTime>,
    /// When it was first scheduled.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
}

impl TimerRow {
    /// Decodes the payload into `T`.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T, TimerError> {
        serde_json::from_value(self.payload.clone()).map_err(|e| TimerError::Payload {
            id: self.id.to_string(),
            source: std::sync::Arc::new(e),
        })
    }

    pub(crate) fn from_record(record: keiro_store::TimerRow) -> Result<TimerRow, TimerError> {
        let payload = serde_json::from_str(&record.payload).map_err(|e| TimerError::Payload {
            id: record.id.clone(),
            source: std::sync::Arc::new(e),
        })?;
        Ok(TimerRow {
            payload,
            id: TimerId(record.id),
            process_manager: record.process_manager,
            correlation_id: record.correlation_id,
            fire_at: from_us(record.fire_at),
            status: record.status,
            attempts: u32::try_from(record.attempts.max(0)).unwrap_or(u32::MAX),
            last_error: record.last_error,
            event_id: record.event_id,
            claimed_at: record.claimed_at.map(from_us),
            resume_lease_until: record.resume_lease_until.map(from_us),
            created_at: from_us(record.created_at),
            updated_at: from_us(record.updated_at),
        })
    }
}

/// What an id-only mutation ([`super::Timers::cancel`], `requeue`,
/// `reschedule`, `dead_letter`, `mark_fired`) did. A timer held by a guarded
/// resume claim is refused with [`TimerError::HeldForResume`] instead.
// Returned once per call, never stored in bulk: boxing the row buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum TimerChange {
    /// It applied; the timer as it is now.
    Applied(TimerRow),
    /// No timer has this id.
    NotFound,
    /// The timer's status does not allow it; nothing changed.
    NotApplicable(TimerStatus),
}

impl TimerChange {
    /// Whether the mutation applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, TimerChange::Applied(_))
    }

    /// The timer as `action` left it, or the refusal naming timer `id`:
    /// [`TimerError::NotFound`], or [`TimerError::NotApplicable`] with the
    /// status that refused it.
    pub fn applied(self, id: &TimerId, action: TimerAction) -> Result<TimerRow, TimerError> {
        match self {
            TimerChange::Applied(timer) => Ok(timer),
            TimerChange::NotFound => Err(TimerError::NotFound { id: id.to_string() }),
            TimerChange::NotApplicable(status) => Err(TimerError::NotApplicable {
                id: id.to_string(),
                action,
                status,
            }),
        }
    }
}

/// The changes an operator makes to one timer by id, as
/// [`TimerError::NotApplicable`] names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimerAction {
    /// [`super::Timers::requeue`].
    Requeue,
    /// [`super::Timers::cancel`].
    Cancel,
    /// [`super::Timers::requeue_dead`].
    Resume,
}

impl TimerAction {
    /// Its name: `requeue`, `cancel`, `resume`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimerAction::Requeue => "requeue",
            TimerAction::Cancel => "cancel",
            TimerAction::Resume => "resume",
        }
    }

    /// Which timers it takes, as a refusal says it (`a firing or dead`).
    pub fn takes(self) -> &'static str {
        match self {
            TimerAction::Requeue => "a firing or dead",
            TimerAction::Cancel => "a scheduled, firing or dead",
            TimerAction::Resume => "a dead",
        }
    }
}

impl std::fmt::Display for TimerAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
