//! `#[step(timeout_ms = ..)]` and `#[step(retry_if = ..)]` inside workflows,
//! on both backends: an attempt that overruns is dropped and counted as a
//! failed attempt; an error the predicate calls permanent ends the step at
//! once, journaled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use keiro::{step, workflow, StepTimeout};
use keiro_tests::{on_both_backends, Backend, TestDb};
use serde::{Deserialize, Serialize};

/// How many attempts each key's step began, and which got past their sleep.
static ATTEMPTS: Mutex<Option<HashMap<String, (u32, u32)>>> = Mutex::new(None);

fn begin(key: &str) -> u32 {
    let mut all = ATTEMPTS.lock().unwrap();
    let entry = all
        .get_or_insert_with(HashMap::new)
        .entry(key.to_owned())
        .or_default();
    entry.0 += 1;
    entry.0
}

fn finished_sleep(key: &str) {
    let mut all = ATTEMPTS.lock().unwrap();
    all.get_or_insert_with(HashMap::new)
        .entry(key.to_owned())
        .or_default()
        .1 += 1;
}

fn attempts(key: &str) -> (u32, u32) {
    ATTEMPTS
        .lock()
        .unwrap()
        .as_ref()
        .and_then(|m| m.get(key).copied())
        .unwrap_or_default()
}

/// Sleeps `slow_ms` on attempts up to `slow_until`, then answers at once.
#[step(timeout_ms = 100, max_attempts = 3, backoff_ms = 10)]
async fn sometimes_slow(key: String, slow_until: u32) -> Result<u32, String> {
    let attempt = begin(&key);
    if attempt <= slow_until {
        tokio::time::sleep(Duration::from_secs(5)).await;
        finished_sleep(&key);
    }
    Ok(attempt)
}

#[workflow]
async fn timed(key: String, slow_until: u32) -> Result<u32, String> {
    sometimes_slow(key, slow_until).await
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum ChargeError {
    Declined,
    Unavailable,
    TimedOut(String),
}

impl From<StepTimeout> for ChargeError {
    fn from(t: StepTimeout) -> Self {
        ChargeError::TimedOut(t.to_string())
    }
}

fn is_transient(error: &ChargeError) -> bool {
    !matches!(error, ChargeError::Declined)
}

/// Fails with `error` every attempt.
#[step(max_attempts = 4, backoff_ms = 5, retry_if = is_transient, timeout_ms = 2000)]
async fn charge(key: String, error: ChargeError) -> Result<(), ChargeError> {
    begin(&key);
    Err(error)
}

#[workflow]
async fn charging(key: String, error: ChargeError) -> Result<(), ChargeError> {
    charge(key, error).await
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn an_attempt_over_its_timeout_is_dropped_and_retried(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = fresh("slow-once");
    let out = timed(key.clone(), 1).id(&key).on(&keiro).await.unwrap();
    assert_eq!(out, Ok(2), "the second attempt answered");
    assert_eq!(
        attempts(&key),
        (2, 0),
        "the slow attempt never got past its sleep"
    );
    // Every attempt too slow: the timeout is the journaled, final error.
    let key = fresh("always-slow");
    let out = timed(key.clone(), 99).id(&key).on(&keiro).await.unwrap();
    assert_eq!(
        out,
        Err("step `sometimes_slow` timed out after 100 ms".to_owned())
    );
    assert_eq!(attempts(&key), (3, 0));
    // A replay returns the journaled error without running the step.
    let again = timed(key.clone(), 99).id(&key).on(&keiro).await.unwrap();
    assert_eq!(again, out);
    assert_eq!(attempts(&key), (3, 0));
}

async fn retry_if_ends_a_permanent_error_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = fresh("declined");
    let out = charging(key.clone(), ChargeError::Declined)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Err(ChargeError::Declined));
    assert_eq!(attempts(&key).0, 1, "a permanent error is not retried");
    let key = fresh("unavailable");
    let out = charging(key.clone(), ChargeError::Unavailable)
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Err(ChargeError::Unavailable));
    assert_eq!(
        attempts(&key).0,
        4,
        "a transient error is retried max_attempts times"
    );
}

on_both_backends!(
    an_attempt_over_its_timeout_is_dropped_and_retried,
    retry_if_ends_a_permanent_error_at_once,
);
