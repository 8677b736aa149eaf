//! Guarded resume of dead timers, on both backends: claim, renew, complete,
//! park and cancel under a lease, the refusals, and expired resume claims
//! recovering to dead in a worker pass.

use std::time::{Duration, SystemTime};

use keiro::timers::{
    FireOutcome, TimerError, TimerId, TimerResumeClaim, TimerStatus, TimerWorkerOptions,
};
use keiro_tests::timers::{dead, no_requeue, past, row, schedule, timers};
use keiro_tests::{on_both_backends, Backend, TestDb};

on_both_backends!(
    guarded_resume_claim_renew_complete,
    guarded_resume_park_and_cancel,
    guarded_resume_refusals,
    expired_resume_claims_recover_to_dead_in_a_worker_pass,
);

const LEASE: Duration = Duration::from_secs(60);

async fn guarded_resume_claim_renew_complete(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let before = dead(&timers, "t-1", "handler refused").await;
    let claim = timers
        .claim_dead(&TimerId::new("t-1"), LEASE)
        .await
        .unwrap();
    assert_eq!(claim.id().as_str(), "t-1");
    let held = row(&timers, "t-1").await;
    assert_eq!(held.status, TimerStatus::Resuming);
    assert_eq!(held.resume_lease_until, claim.lease_until());
    assert_eq!(held.last_error, before.last_error);
    assert_eq!(held.attempts, before.attempts);

    // The token travels as a string (to a later request, another process).
    let token = claim.token();
    let rebuilt = TimerResumeClaim::from_token(&token).unwrap();
    assert_eq!(rebuilt.id(), claim.id());
    let renewed = timers
        .renew_resume(&rebuilt, Duration::from_secs(120))
        .await
        .unwrap();
    assert!(renewed.lease_until().unwrap() > claim.lease_until().unwrap());
    assert_eq!(renewed.token(), token, "renewal keeps the token");

    let done = timers.complete_resume(&renewed, "ev-manual").await.unwrap();
    assert_eq!(done.status, TimerStatus::Fired);
    assert_eq!(done.event_id.as_deref(), Some("ev-manual"));
    assert_eq!(done.resume_lease_until, None);
    let spent = timers
        .complete_resume(&renewed, "ev-again")
        .await
        .unwrap_err();
    assert!(matches!(
        spent,
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Fired),
            ..
        }
    ));
}

async fn guarded_resume_park_and_cancel(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    dead(&timers, "park", "original").await;
    dead(&timers, "cancel", "original").await;

    let claim = timers
        .claim_dead(&TimerId::new("park"), LEASE)
        .await
        .unwrap();
    let parked = timers
        .park_resume(&claim, Some("customer asked to wait"))
        .await
        .unwrap();
    assert_eq!(parked.status, TimerStatus::Dead);
    assert_eq!(parked.last_error.as_deref(), Some("customer asked to wait"));
    assert_eq!(parked.attempts, 1);
    // Parked: dead again, claimable anew; a park without a reason keeps it.
    let again = timers
        .claim_dead(&TimerId::new("park"), LEASE)
        .await
        .unwrap();
    let parked = timers.park_resume(&again, None).await.unwrap();
    assert_eq!(parked.last_error.as_deref(), Some("customer asked to wait"));

    let claim = timers
        .claim_dead(&TimerId::new("cancel"), LEASE)
        .await
        .unwrap();
    let cancelled = timers.cancel_resume(&claim).await.unwrap();
    assert_eq!(cancelled.status, TimerStatus::Cancelled);
    assert!(matches!(
        timers.park_resume(&claim, None).await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Cancelled),
            ..
        }
    ));
}

async fn guarded_resume_refusals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    schedule(&timers, past("live")).await;
    assert!(matches!(
        timers
            .claim_dead(&TimerId::new("live"), LEASE)
            .await
            .unwrap_err(),
        TimerError::NotDead {
            status: TimerStatus::Scheduled,
            ..
        }
    ));
    assert!(matches!(
        timers
            .claim_dead(&TimerId::new("missing"), LEASE)
            .await
            .unwrap_err(),
        TimerError::NotFound { .. }
    ));
    timers.cancel(&TimerId::new("live")).await.unwrap();
    dead(&timers, "t-1", "boom").await;
    let id = TimerId::new("t-1");
    for lease in [
        Duration::ZERO,
        keiro::timers::MAX_RESUME_LEASE + Duration::from_secs(1),
    ] {
        assert!(matches!(
            timers.claim_dead(&id, lease).await.unwrap_err(),
            TimerError::InvalidLease { .. }
        ));
    }
    let claim = timers.claim_dead(&id, LEASE).await.unwrap();
    assert!(matches!(
        timers.claim_dead(&id, LEASE).await.unwrap_err(),
        TimerError::HeldForResume { .. }
    ));

    // Id-only mutations refuse a held timer.
    let held = |e: TimerError| matches!(e, TimerError::HeldForResume { ref id, .. } if id == "t-1");
    assert!(held(timers.cancel(&id).await.unwrap_err()));
    assert!(held(timers.requeue(&id).await.unwrap_err()));
    assert!(held(
        timers
            .reschedule(&id, SystemTime::now(), None)
            .await
            .unwrap_err()
    ));
    assert!(held(timers.dead_letter(&id, "x").await.unwrap_err()));
    assert!(held(timers.mark_fired(&id, "ev").await.unwrap_err()));
    // Workers pass it over.
    let summary = timers
        .drain(&TimerWorkerOptions::default(), 10, |_| async {
            FireOutcome::completed("never")
        })
        .await
        .unwrap();
    assert_eq!(summary.processed, 0);

    // A forged token holds nothing.
    let forged = TimerResumeClaim::from_token(&claim.token().replacen('.', ".x", 1)).unwrap();
    assert!(matches!(
        timers.complete_resume(&forged, "ev").await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Resuming),
            ..
        }
    ));
    assert!(matches!(
        TimerResumeClaim::from_token("not a token").unwrap_err(),
        TimerError::MalformedResumeToken { .. }
    ));
    assert_eq!(row(&timers, "t-1").await.status, TimerStatus::Resuming);
    timers.cancel_resume(&claim).await.unwrap();
}

async fn expired_resume_claims_recover_to_dead_in_a_worker_pass(backend: Backend) {
    let db = TestDb::new(backend).await;
    let timers = timers(&db).await;
    let before = dead(&timers, "t-1", "handler refused").await;
    let claim = timers
        .claim_dead(&TimerId::new("t-1"), Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Lapsed: the holder can no longer act, even before any sweep.
    assert!(matches!(
        timers.renew_resume(&claim, LEASE).await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Resuming),
            ..
        }
    ));
    // A worker with ordinary recovery off still sweeps it back to dead.
    let summary = timers
        .drain(&no_requeue(), 10, |_| async {
            FireOutcome::completed("never")
        })
        .await
        .unwrap();
    assert_eq!((summary.recovered_resumes, summary.processed), (1, 0));
    let recovered = row(&timers, "t-1").await;
    assert_eq!(recovered.status, TimerStatus::Dead);
    assert_eq!(recovered.last_error, before.last_error);
    assert_eq!(recovered.attempts, before.attempts);
    assert_eq!(recovered.resume_lease_until, None);
    assert!(matches!(
        timers.complete_resume(&claim, "ev").await.unwrap_err(),
        TimerError::ResumeClaimLost {
            status: Some(TimerStatus::Dead),
            ..
        }
    ));
    // And the standalone sweep finds nothing left.
    assert_eq!(timers.recover_expired_resumes().await.unwrap(), 0);
}
