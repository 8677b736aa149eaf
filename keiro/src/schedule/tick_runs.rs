//! The runs a scheduler starts itself: each tick's instance it created under
//! its process's lease, driven like its resume worker's claims (the same
//! options, the same stop signal) and awaited when that worker ends.

use std::sync::Mutex;

use keiro_store::InstanceRow;
use tokio::task::JoinSet;

use crate::resume::ResumeOptions;
use crate::shutdown::Stop;
use crate::Keiro;

/// The scheduler's runs in flight.
pub(crate) struct TickRuns {
    options: ResumeOptions,
    stop: Stop,
    tasks: Mutex<JoinSet<()>>,
}

impl TickRuns {
    /// Runs that follow the worker's `options` and `stop`.
    pub(crate) fn new(options: ResumeOptions, stop: Stop) -> TickRuns {
        TickRuns {
            options,
            stop,
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// Drives `row`, created a moment ago under this process's lease (so
    /// with no journal to read), in a task of its own.
    pub(crate) fn start(&self, keiro: &Keiro, row: InstanceRow) {
        let row = InstanceRow { fresh: true, ..row };
        let (keiro, options, stop) = (keiro.clone(), self.options.clone(), self.stop.clone());
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        // Forget the runs that ended, so the set holds only live ones.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            keiro.advance(row, &options, stop).await;
        });
    }

    /// Waits for every run started so far to end: a draining worker lets them
    /// finish, a halting one stops them (each releases its lease).
    pub(crate) async fn wait(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        while tasks.join_next().await.is_some() {}
    }
}
