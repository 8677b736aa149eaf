//! Suspending on several wake conditions at once, for a durable select: a
//! run waiting on a sleep, an awakeable or child, and a message all at once
//! sleeps until the first of them, however they race with the suspension.

use crate::journal::get_step_on;
use crate::{Result, Store, StoreError, Suspend};

impl Store {
    /// Suspends like [`Store::suspend`], but due at once when ANY of
    /// `steps` (of this generation) is recorded or ANY of `topics` has a
    /// message waiting, checked under the instance's row lock in one
    /// transaction; otherwise due at `suspend.wake_at` (never by time when
    /// `None`). A concurrent answer, child end or send is either seen here or
    /// sees the suspended instance and makes it due, so a select never
    /// sleeps past the first of its wake conditions. `suspend.awaiting` is
    /// checked like one more of `steps`. Returns whether it applied (the
    /// lease was still held).
    pub async fn suspend_for_any(
        &self,
        suspend: &Suspend<'_>,
        steps: &[i64],
        topics: &[String],
    ) -> Result<bool> {
        const OP: &str = "suspend_for_any";
        let now = self.now_us();
        dispatch!(Store, self, |s, sql| {
            let mut tx = s.begin(OP).await?;
            crate::prepared::query(&sql.talk.instance_status_locked)
                .bind(suspend.id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?;
            let mut due = false;
            for &seq in steps.iter().chain(suspend.awaiting.as_ref()) {
                if due {
                    break;
                }
                due = get_step_on((&mut *tx).into(), OP, suspend.id, suspend.generation, seq)
                    .await?
                    .is_some();
            }
            for topic in topics {
                if due {
                    break;
                }
                due = crate::prepared::query(&sql.talk.message_waiting)
                    .bind(suspend.id)
                    .bind(topic)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(StoreError::query(OP))?
                    .is_some();
            }
            let applied = crate::prepared::query(&sql.suspend)
                .bind(suspend.id)
                .bind(suspend.generation)
                .bind(suspend.owner)
                .bind(if due { Some(now) } else { suspend.wake_at })
                .bind(now)
                .bind(None::<i64>)
                .bind(suspend.waiting.map(|w| w.seq))
                .bind(suspend.waiting.map(|w| w.kind.as_str()))
                .bind(suspend.waiting.map(|w| w.name.as_str()))
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(OP))?
                .rows_affected()
                == 1;
            tx.commit().await.map_err(StoreError::query(OP))?;
            Ok(applied)
        })
    }
}
