//! How a timer schedule runs on SQLite: its statements in one `BEGIN
//! IMMEDIATE` transaction, so the insert, the re-arm and the status read see
//! one state.

use super::SqliteStore;
use crate::{timers, NewTimer, Result, ScheduleOutcome, StoreError};

impl SqliteStore {
    pub(crate) async fn schedule_timer(
        &self,
        timer: &NewTimer<'_>,
        once: bool,
    ) -> Result<ScheduleOutcome> {
        const OP: &str = "schedule_timer";
        let mut tx = self.begin(OP).await?;
        let outcome = timers::schedule((&mut *tx).into(), timer, once).await?;
        tx.commit().await.map_err(StoreError::query(OP))?;
        Ok(outcome)
    }
}
