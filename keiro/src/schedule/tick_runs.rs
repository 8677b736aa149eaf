//! The runs a scheduler starts itself: each tick's instance it created under
//! its process's lease, driven like its resume worker's claims (the same
//! options, the same stop signal, a slot of the same concurrency budget)
//! and awaited when that worker ends.

use std::sync::Mutex;

use keiro_store::InstanceRow;
use tokio::task::JoinSet;

use crate::resume::{Held, ResumeOptions, Slots};
use crate::shutdown::Stop;
use crate::Keiro;

/// The scheduler's runs in flight.
pub(crate) struct TickRuns {
    options: ResumeOptions,
    stop: Stop,
    /// The worker's concurrency budget.
    slots: Slots,
    tasks: Mutex<JoinSet<()>>,
}

impl TickRuns {
    /// Runs that follow the worker's `options` and `stop`, each in one of
    /// its `slots`.
    pub(crate) fn new(options: ResumeOptions, stop: Stop, slots: Slots) -> TickRuns {
        TickRuns {
            options,
            stop,
            slots,
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// One of the worker's slots, if one is free now.
    pub(crate) fn slot(&self) -> Option<Held> {
        Some(self.slots.take(1)).filter(|held| held.count() == 1)
    }

    /// Drives `row`, created a moment ago under this process's lease (so
    /// with no journal to read), in a task of its own holding `slot` until
    /// the run ends.
    pub(crate) fn start(&self, keiro: &Keiro, row: InstanceRow, slot: Held) {
        let row = InstanceRow { fresh: true, ..row };
        let (keiro, options, stop) = (keiro.clone(), self.options.clone(), self.stop.clone());
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        // Forget the runs that ended, so the set holds only live ones.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            keiro.advance(row, &options, stop).await;
            drop(slot);
        });
    }

    /// Waits for every run started so far to end: a draining worker lets them
    /// finish, a halting one stops them (each releases its lease).
    pub(crate) async fn wait(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        while tasks.join_next().await.is_some() {}
    }
}
