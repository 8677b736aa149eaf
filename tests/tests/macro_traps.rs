//! Traps in how `#[workflow]` and `#[step]` read a return type, on both
//! backends: a `Result` is recognised by its type, not by how it is spelled, so
//! an alias, a fully qualified path or an alias from another module makes an
//! `Err` fail the workflow (and a retried step retry) like `Result<T, E>` does.

use keiro::{step, workflow, WorkflowStatus};
use keiro_tests::{count, on_both_backends, ran, Backend, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum MyError {
    Refused(u32),
}

/// A local alias: the last path segment is `R`, not `Result`.
type R<T> = Result<T, MyError>;

/// An `anyhow::Result`-style alias declared in another module.
mod errors {
    pub(crate) type Res<T> = std::result::Result<T, super::MyError>;
}

#[workflow]
async fn via_alias(n: u32) -> R<u32> {
    if n == 0 {
        return Err(MyError::Refused(n));
    }
    Ok(n * 2)
}

#[workflow]
async fn fully_qualified(n: u32) -> std::result::Result<u32, MyError> {
    if n == 0 {
        return Err(MyError::Refused(n));
    }
    Ok(n * 2)
}

#[workflow]
async fn via_module_alias(n: u32) -> errors::Res<u32> {
    if n == 0 {
        return Err(MyError::Refused(n));
    }
    Ok(n * 2)
}

/// Runs `workflow` to an `Err` and to an `Ok` and checks what was recorded.
async fn assert_outcomes(
    backend: Backend,
    name: &str,
    workflow: fn(u32) -> keiro::WorkflowCall<Result<u32, MyError>>,
) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;

    let id = format!("{name}-err-{}", uuid::Uuid::new_v4());
    let out = workflow(0).id(&id).on(&keiro).await.unwrap();
    assert_eq!(out, Err(MyError::Refused(0)), "{name}");
    let handle = keiro.handle::<Result<u32, MyError>>(&id).await.unwrap();
    assert_eq!(
        handle.status().await.unwrap(),
        WorkflowStatus::Failed,
        "`{name}` returned `Err`, so it must be recorded as failed"
    );
    assert_eq!(handle.result().await.unwrap(), Err(MyError::Refused(0)));

    let id = format!("{name}-ok-{}", uuid::Uuid::new_v4());
    assert_eq!(workflow(4).id(&id).on(&keiro).await.unwrap(), Ok(8));
    let handle = keiro.handle::<Result<u32, MyError>>(&id).await.unwrap();
    assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);
    assert_eq!(handle.result().await.unwrap(), Ok(8));
}

async fn local_alias_err_fails_the_workflow(backend: Backend) {
    assert_outcomes(backend, "via_alias", via_alias).await;
}

async fn fully_qualified_result_err_fails_the_workflow(backend: Backend) {
    assert_outcomes(backend, "fully_qualified", fully_qualified).await;
}

async fn alias_from_another_module_err_fails_the_workflow(backend: Backend) {
    assert_outcomes(backend, "via_module_alias", via_module_alias).await;
}

/// Fails on its first two attempts under a key, then succeeds.
#[step(max_attempts = 4, backoff_ms = 1)]
async fn flaky_aliased(key: String) -> R<u32> {
    ran(&key, "flaky_aliased");
    match count(&key, "flaky_aliased") {
        n @ 1..=2 => Err(MyError::Refused(n as u32)),
        n => Ok(n as u32),
    }
}

/// Always fails: every attempt runs, and the last `Err` is the step's result.
#[step(max_attempts = 3, backoff_ms = 1)]
async fn doomed_aliased(key: String) -> errors::Res<u32> {
    ran(&key, "doomed_aliased");
    Err(MyError::Refused(count(&key, "doomed_aliased") as u32))
}

#[workflow]
async fn retries_aliased(key: String) -> R<(u32, u32)> {
    let ok = flaky_aliased(key.clone()).await?;
    let err = doomed_aliased(key).await.unwrap_err();
    let MyError::Refused(last) = err;
    Ok((ok, last))
}

async fn retried_step_returning_an_alias_is_retried(backend: Backend) {
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    let key = uuid::Uuid::new_v4().to_string();
    let out = retries_aliased(key.clone())
        .id(&key)
        .on(&keiro)
        .await
        .unwrap();
    assert_eq!(out, Ok((3, 3)));
    assert_eq!(
        count(&key, "flaky_aliased"),
        3,
        "attempts of the aliased step"
    );
    assert_eq!(
        count(&key, "doomed_aliased"),
        3,
        "attempts of the failing step"
    );
    let journal = keiro.store().load_journal(&key, 0).await.unwrap();
    assert_eq!(journal[0].result, r#"{"Ok":3}"#);
    assert_eq!(journal[1].result, r#"{"Err":{"Refused":3}}"#);
}

on_both_backends!(
    local_alias_err_fails_the_workflow,
    fully_qualified_result_err_fails_the_workflow,
    alias_from_another_module_err_fails_the_workflow,
    retried_step_returning_an_alias_is_retried,
);
