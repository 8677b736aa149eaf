//! How the admin API says no: a JSON body `{"error": TEXT, "kind": KIND}`
//! with an HTTP status that fits. For a [`crate::Error`] the text is its
//! `Display` sentence, word for word, and the kind its variant in
//! snake_case (a timer error's kind is prefixed `timer_`).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::timers::TimerError;
use crate::{Error, StoreError};

/// A refused or failed admin request, as the JSON error it answers with.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// The HTTP status.
    pub(crate) status: StatusCode,
    /// What kind of refusal, in snake_case.
    pub(crate) kind: &'static str,
    /// The sentence saying what went wrong and what to do.
    pub(crate) message: String,
}

impl ApiError {
    /// An error of `kind` answered with `status`.
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    /// Bad input (400) of `kind`.
    pub(crate) fn bad_request(kind: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, kind, message)
    }

    /// A transition the instance's or timer's state refuses (409).
    pub(crate) fn conflict(kind: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, kind, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.message, "kind": self.kind });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        let (status, kind) = classify(&error);
        ApiError::new(status, kind, error.to_string())
    }
}

impl From<TimerError> for ApiError {
    fn from(error: TimerError) -> Self {
        ApiError::from(Error::from(error))
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::from(Error::from(error))
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let (status, kind) = match &rejection {
            JsonRejection::JsonSyntaxError(_) => (StatusCode::BAD_REQUEST, "malformed_json"),
            // Valid JSON of the wrong shape (a field missing or mistyped):
            // bad input too, where axum would say 422.
            JsonRejection::JsonDataError(_) => (StatusCode::BAD_REQUEST, "invalid_json_body"),
            JsonRejection::MissingJsonContentType(_) => {
                (rejection.status(), "missing_json_content_type")
            }
            _ => (rejection.status(), "unreadable_body"),
        };
        // axum's text names what is wrong and where (line and column, or
        // the field), which is what the caller needs to fix the request.
        ApiError::new(status, kind, rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::bad_request("invalid_query", rejection.body_text())
    }
}

/// The status and kind of a keiro error.
fn classify(error: &Error) -> (StatusCode, &'static str) {
    use StatusCode as S;
    match error {
        Error::Store(e) => classify_store(e),
        Error::Timer(e) => classify_timer(e),
        Error::NotFound { .. } => (S::NOT_FOUND, "not_found"),
        Error::UnknownAwakeable { .. } => (S::NOT_FOUND, "unknown_awakeable"),
        Error::UnknownSchedule { .. } => (S::NOT_FOUND, "unknown_schedule"),
        Error::InvalidSchedule { .. } => (S::BAD_REQUEST, "invalid_schedule"),
        Error::IdConflict { .. } => (S::CONFLICT, "id_conflict"),
        Error::Duplicate { .. } => (S::CONFLICT, "duplicate"),
        Error::InputMismatch { .. } => (S::CONFLICT, "input_mismatch"),
        Error::SignatureMismatch { .. } => (S::CONFLICT, "signature_mismatch"),
        Error::NotSetAside { .. } => (S::CONFLICT, "not_set_aside"),
        Error::NotRetryable { .. } => (S::CONFLICT, "not_retryable"),
        Error::AlreadyResolved { .. } => (S::CONFLICT, "already_resolved"),
        Error::AwakeableWorkflowFinished { .. } => (S::CONFLICT, "awakeable_workflow_finished"),
        Error::NotReceiving { .. } => (S::CONFLICT, "not_receiving"),
        Error::Cancelled { .. } => (S::CONFLICT, "cancelled"),
        Error::TimedOut { .. } => (S::CONFLICT, "timed_out"),
        Error::ChildFailed { .. } => (S::CONFLICT, "child_failed"),
        Error::NonDeterministic { .. } => (S::CONFLICT, "non_deterministic"),
        Error::Panicked { .. } => (S::CONFLICT, "panicked"),
        Error::Failed { .. } => (S::CONFLICT, "failed"),
        Error::Rejected { .. } => (S::CONFLICT, "rejected"),
        Error::Stopped { .. } => (S::CONFLICT, "stopped"),
        Error::UnknownWorkflow { .. } => (S::CONFLICT, "unknown_workflow"),
        Error::AwakeableTypeMismatch { .. } => (S::BAD_REQUEST, "awakeable_type_mismatch"),
        Error::AwakeableAnswerInvalid { .. } => (S::BAD_REQUEST, "awakeable_answer_invalid"),
        Error::MessageType(_) => (S::BAD_REQUEST, "message_type"),
        Error::Encode { .. } => (S::BAD_REQUEST, "encode"),
        Error::NotJournalable { .. } => (S::BAD_REQUEST, "not_journalable"),
        Error::InvalidId { .. } => (S::BAD_REQUEST, "invalid_id"),
        Error::InvalidAppVersion { .. } => (S::BAD_REQUEST, "invalid_app_version"),
        Error::EmptyId { .. } => (S::BAD_REQUEST, "empty_id"),
        Error::InvalidCursor { .. } => (S::BAD_REQUEST, "invalid_cursor"),
        Error::InvalidOption { .. } => (S::BAD_REQUEST, "invalid_option"),
        Error::PayloadTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "payload_too_large"),
        Error::NoWorker { .. } => (S::SERVICE_UNAVAILABLE, "no_worker"),
        Error::NoQueueWorker { .. } => (S::SERVICE_UNAVAILABLE, "no_queue_worker"),
        Error::ShutDown { .. } => (S::SERVICE_UNAVAILABLE, "shut_down"),
        Error::ClockSkew { .. } => (S::SERVICE_UNAVAILABLE, "clock_skew"),
        Error::Decode { .. } => (S::INTERNAL_SERVER_ERROR, "decode"),
        Error::DuplicateWorkflow { .. } => (S::INTERNAL_SERVER_ERROR, "duplicate_workflow"),
        Error::ExecutorIdInUse { .. } => (S::INTERNAL_SERVER_ERROR, "executor_id_in_use"),
        Error::NotInWorkflow { .. } => (S::INTERNAL_SERVER_ERROR, "not_in_workflow"),
        Error::ContinueAsOther { .. } => (S::INTERNAL_SERVER_ERROR, "continue_as_other"),
        Error::TransactionEnded { .. } => (S::INTERNAL_SERVER_ERROR, "transaction_ended"),
        Error::TransactionAborted { .. } => (S::INTERNAL_SERVER_ERROR, "transaction_aborted"),
        Error::AlreadyInitialized => (S::INTERNAL_SERVER_ERROR, "already_initialized"),
        Error::NoExecutorId { .. } => (S::INTERNAL_SERVER_ERROR, "no_executor_id"),
        Error::Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// The status and kind of a timer error.
fn classify_timer(error: &TimerError) -> (StatusCode, &'static str) {
    use StatusCode as S;
    match error {
        TimerError::Store(e) => classify_store(e),
        TimerError::NotFound { .. } => (S::NOT_FOUND, "timer_not_found"),
        TimerError::NotDead { .. } => (S::CONFLICT, "timer_not_dead"),
        TimerError::NotApplicable { .. } => (S::CONFLICT, "timer_not_applicable"),
        TimerError::HeldForResume { .. } => (S::CONFLICT, "timer_held_for_resume"),
        TimerError::ResumeClaimLost { .. } => (S::CONFLICT, "timer_resume_claim_lost"),
        TimerError::InvalidOption { .. } => (S::BAD_REQUEST, "timer_invalid_option"),
        TimerError::InvalidRequest { .. } => (S::BAD_REQUEST, "timer_invalid_request"),
        TimerError::PayloadTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "timer_payload_too_large"),
        TimerError::InvalidPageLimit { .. } => (S::BAD_REQUEST, "timer_invalid_page_limit"),
        TimerError::MalformedCursor { .. } => (S::BAD_REQUEST, "timer_malformed_cursor"),
        TimerError::WrongCursorKind { .. } => (S::BAD_REQUEST, "timer_wrong_cursor_kind"),
        TimerError::InvalidLease { .. } => (S::BAD_REQUEST, "timer_invalid_lease"),
        TimerError::MalformedResumeToken { .. } => (S::BAD_REQUEST, "timer_malformed_resume_token"),
        TimerError::Payload { .. } => (S::INTERNAL_SERVER_ERROR, "timer_payload"),
        TimerError::ClockSkew { .. } => (S::SERVICE_UNAVAILABLE, "timer_clock_skew"),
    }
}

/// A store error: bad input for a refused id, 503 when trying again may
/// help (`store_unavailable`), 500 otherwise.
fn classify_store(error: &StoreError) -> (StatusCode, &'static str) {
    match error {
        StoreError::InvalidId { .. } => (StatusCode::BAD_REQUEST, "invalid_id"),
        e if e.is_transient() => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "store"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keiro_error_keeps_its_sentence() {
        let error = Error::NotFound { id: "x".into() };
        let api = ApiError::from(error.clone());
        assert_eq!(api.status, StatusCode::NOT_FOUND);
        assert_eq!(api.kind, "not_found");
        assert_eq!(api.message, error.to_string());
    }
}
