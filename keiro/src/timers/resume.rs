//! Guarded foreground resume of dead timers.
//!
//! An operator (or a user-facing "try again" button) takes a dead timer out of
//! the dead-letter set with [`Timers::claim_dead`], after whatever
//! authorization the application requires. The claim is an expiring lease
//! named by an opaque token: renew it while the work runs, then complete
//! (fired), park (back to dead) or cancel it. While a claim holds a timer, no
//! worker claims it and every id-only mutation is refused with
//! [`TimerError::HeldForResume`]. A claim that lapses goes back to dead with
//! its reason and attempts intact; every timer worker pass sweeps those, even
//! with ordinary stale-claim recovery turned off.
//!
//! The work itself is at-least-once: a claim that lapses mid-work may be
//! claimed and done again. Callers own deduplicating its effects.

use std::time::{Duration, SystemTime};

use keiro_store::{ResumeClaimOutcome, ResumeUpdate, TimerStatus};

use super::{TimerAction, TimerError, TimerId, TimerRow, Timers};
use crate::time::{duration_us, from_us};

/// The longest lease [`Timers::claim_dead`] and [`Timers::renew_resume`] grant.
pub const MAX_RESUME_LEASE: Duration = Duration::from_secs(3600);

const TOKEN_TAG: &str = "kr1";

/// A guarded claim on a dead timer, held until it is ended or its lease lapses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerResumeClaim {
    id: TimerId,
    secret: String,
    lease_until: Option<SystemTime>,
}

impl TimerResumeClaim {
    /// The claimed timer.
    pub fn id(&self) -> &TimerId {
        &self.id
    }

    /// The opaque token naming this claim, to hand to whoever finishes the
    /// work (a later request, another process); [`TimerResumeClaim::from_token`]
    /// turns it back into a claim. It stays the same across renewals.
    pub fn token(&self) -> String {
        let mut out = format!("{TOKEN_TAG}.{}.", self.secret);
        for byte in self.id.as_str().bytes() {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }

    /// When the lease lapses unless renewed, as of the claim or renewal that
    /// produced this value (`None` for a claim rebuilt from its token).
    pub fn lease_until(&self) -> Option<SystemTime> {
        self.lease_until
    }

    /// Rebuilds a claim from [`TimerResumeClaim::token`].
    pub fn from_token(token: &str) -> Result<TimerResumeClaim, TimerError> {
        let malformed = || TimerError::MalformedResumeToken {
            token: token.to_owned(),
        };
        let mut parts = token.split('.');
        let (Some(TOKEN_TAG), Some(secret), Some(id), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        if secret.is_empty() || id.is_empty() || id.len() % 2 != 0 {
            return Err(malformed());
        }
        let bytes = (0..id.len())
            .step_by(2)
            .map(|i| {
                id.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(malformed)?;
        let id = String::from_utf8(bytes).map_err(|_| malformed())?;
        Ok(TimerResumeClaim {
            id: TimerId::new(id),
            secret: secret.to_owned(),
            lease_until: None,
        })
    }
}

fn check_lease(lease: Duration) -> Result<i64, TimerError> {
    if lease.is_zero() || lease > MAX_RESUME_LEASE {
        return Err(TimerError::InvalidLease {
            lease,
            max: MAX_RESUME_LEASE,
        });
    }
    Ok(duration_us(lease))
}

impl Timers {
    /// Puts dead timer `id` back in line at its fire time with zero
    /// attempts, for a worker to fire again (an operator's "resume", without
    /// the guarded claim of [`Timers::claim_dead`]); returns it as it is now.
    /// Any other status is refused with [`TimerError::NotDead`] (a stuck,
    /// `firing` one is for [`Timers::requeue`]; a `resuming` one is held by a
    /// foreground claim), an unknown id with [`TimerError::NotFound`]. The
    /// status is read first, then the timer requeued; the requeue itself
    /// refuses a timer a foreground claim took in between.
    pub async fn requeue_dead(&self, id: &TimerId) -> Result<TimerRow, TimerError> {
        let timer = self
            .get(id)
            .await?
            .ok_or_else(|| TimerError::NotFound { id: id.to_string() })?;
        if timer.status != TimerStatus::Dead {
            return Err(TimerError::NotDead {
                id: id.to_string(),
                status: timer.status,
            });
        }
        self.requeue(id).await?.applied(id, TimerAction::Resume)
    }

    /// Claims a dead timer for a foreground resume, held for `lease` (at most
    /// [`MAX_RESUME_LEASE`]). Its reason and attempts are kept. Refused with
    /// [`TimerError::NotFound`], [`TimerError::NotDead`] or, while another
    /// live claim holds it, [`TimerError::HeldForResume`].
    pub async fn claim_dead(
        &self,
        id: &TimerId,
        lease: Duration,
    ) -> Result<TimerResumeClaim, TimerError> {
        let lease_us = check_lease(lease)?;
        let secret = uuid::Uuid::new_v4().simple().to_string();
        let now = self.store.now_us();
        let until = now.saturating_add(lease_us);
        match self
            .store
            .claim_dead_timer(id.as_str(), &secret, until, now)
            .await?
        {
            ResumeClaimOutcome::Claimed(_) => Ok(TimerResumeClaim {
                id: id.clone(),
                secret,
                lease_until: Some(from_us(until)),
            }),
            ResumeClaimOutcome::Missing => Err(TimerError::NotFound { id: id.to_string() }),
            ResumeClaimOutcome::NotDead(status) => Err(TimerError::NotDead {
                id: id.to_string(),
                status,
            }),
            ResumeClaimOutcome::Held { lease_until } => Err(TimerError::HeldForResume {
                id: id.to_string(),
                lease_until: from_us(lease_until),
            }),
        }
    }

    /// Extends a live claim to `lease` from now. Refused with
    /// [`TimerError::ResumeClaimLost`] once the claim has lapsed or ended.
    pub async fn renew_resume(
        &self,
        claim: &TimerResumeClaim,
        lease: Duration,
    ) -> Result<TimerResumeClaim, TimerError> {
        let lease_us = check_lease(lease)?;
        let now = self.store.now_us();
        let until = now.saturating_add(lease_us);
        let update = self
            .store
            .renew_timer_resume(claim.id.as_str(), &claim.secret, until, now)
            .await?;
        ended(claim, update)?;
        Ok(TimerResumeClaim {
            lease_until: Some(from_us(until)),
            ..claim.clone()
        })
    }

    /// Ends a live claim: the work is done and produced `event_id`; the timer
    /// is fired.
    pub async fn complete_resume(
        &self,
        claim: &TimerResumeClaim,
        event_id: &str,
    ) -> Result<TimerRow, TimerError> {
        let update = self
            .store
            .complete_timer_resume(
                claim.id.as_str(),
                &claim.secret,
                event_id,
                self.store.now_us(),
            )
            .await?;
        ended(claim, update)
    }

    /// Ends a live claim without finishing the work: the timer goes back to
    /// dead, with `reason` as its diagnostic when given (else the old one).
    pub async fn park_resume(
        &self,
        claim: &TimerResumeClaim,
        reason: Option<&str>,
    ) -> Result<TimerRow, TimerError> {
        let update = self
            .store
            .park_timer_resume(
                claim.id.as_str(),
                &claim.secret,
                reason,
                self.store.now_us(),
            )
            .await?;
        ended(claim, update)
    }

    /// Ends a live claim by cancelling the timer for good.
    pub async fn cancel_resume(&self, claim: &TimerResumeClaim) -> Result<TimerRow, TimerError> {
        let update = self
            .store
            .cancel_timer_resume(claim.id.as_str(), &claim.secret, self.store.now_us())
            .await?;
        ended(claim, update)
    }

    /// Moves every resume claim that has lapsed back to dead, keeping reason
    /// and attempts. Every worker pass does this; call it directly when no
    /// worker runs. Returns how many.
    pub async fn recover_expired_resumes(&self) -> Result<u64, TimerError> {
        Ok(self
            .store
            .recover_expired_timer_resumes(self.store.now_us())
            .await?)
    }
}

fn ended(claim: &TimerResumeClaim, update: ResumeUpdate) -> Result<TimerRow, TimerError> {
    match update {
        ResumeUpdate::Applied(record) => TimerRow::from_record(record),
        ResumeUpdate::Lost(status) => Err(TimerError::ResumeClaimLost {
            id: claim.id.to_string(),
            status,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_garbage() {
        let claim = TimerResumeClaim {
            id: TimerId::new("order-42.timeout"),
            secret: "abc123".into(),
            lease_until: Some(SystemTime::now()),
        };
        let back = TimerResumeClaim::from_token(&claim.token()).unwrap();
        assert_eq!(back.id(), claim.id());
        assert_eq!(back.token(), claim.token());
        assert_eq!(back.lease_until(), None);
        for bad in [
            "",
            "kr1",
            "kr1.abc",
            "kr1..61",
            "kr1.abc.6",
            "kr1.abc.zz",
            "kr2.abc.61",
            "kr1.a.61.62",
        ] {
            assert!(
                matches!(
                    TimerResumeClaim::from_token(bad),
                    Err(TimerError::MalformedResumeToken { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
