//! How a timer schedule runs on PostgreSQL: on a pooled connection, each
//! statement notifying sleeping workers as it writes (see
//! `postgres/notify.rs`).

use super::PostgresStore;
use crate::{timers, NewTimer, Result, ScheduleOutcome};

impl PostgresStore {
    pub(crate) async fn schedule_timer(
        &self,
        timer: &NewTimer<'_>,
        once: bool,
    ) -> Result<ScheduleOutcome> {
        let mut conn = self.acquire("schedule_timer").await?;
        timers::schedule((&mut *conn).into(), timer, once).await
    }
}
