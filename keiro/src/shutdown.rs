//! Clean shutdown: stop this process's runs, hand their leases back at once
//! and give up the executor identity, so another process continues the work
//! (and may take the identity) without waiting out a lease TTL.

use std::time::Duration;

use tokio::sync::watch;

use crate::{Keiro, Result};

/// How long [`Keiro::shutdown`] waits for halted runs to hand back their
/// leases before it releases whatever is left under its identity.
const HALT_WAIT: Duration = Duration::from_secs(5);

/// What a resume worker is doing, as its runs see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Claiming and running.
    Running,
    /// Claims nothing more; runs in flight go on.
    Draining,
    /// Runs in flight stop now and release their leases.
    Halting,
}

/// The signals that stop a run: its runtime's shutdown and, for a run of a
/// resume worker, that worker's.
#[derive(Debug, Clone)]
pub(crate) struct Stop {
    runtime: watch::Receiver<bool>,
    worker: Option<watch::Receiver<Phase>>,
}

impl Stop {
    /// The signals of a run started in this process outside any worker.
    pub(crate) fn of(keiro: &Keiro) -> Stop {
        Stop {
            runtime: keiro.stop_signal(),
            worker: None,
        }
    }

    /// The signals of a run of the worker following `phase`.
    pub(crate) fn of_worker(keiro: &Keiro, phase: watch::Receiver<Phase>) -> Stop {
        Stop {
            runtime: keiro.stop_signal(),
            worker: Some(phase),
        }
    }

    /// Whether runs should stop now (so claimed ones should not start).
    pub(crate) fn is_halting(&self) -> bool {
        self.reached(|phase| phase == Phase::Halting)
    }

    /// Whether no new pass should claim (the runtime or worker is stopping).
    pub(crate) fn is_draining(&self) -> bool {
        self.reached(|phase| phase != Phase::Running)
    }

    /// Whether the runtime stopped or the worker is in a phase `ends`.
    fn reached(&self, ends: fn(Phase) -> bool) -> bool {
        *self.runtime.borrow()
            || self
                .worker
                .as_ref()
                .is_some_and(|phase| ends(*phase.borrow()))
    }

    /// Completes when no new pass should claim.
    pub(crate) async fn draining(&mut self) {
        self.until(|phase| phase != Phase::Running).await
    }

    /// Completes when runs in flight should stop.
    pub(crate) async fn wait(&mut self) {
        self.until(|phase| phase == Phase::Halting).await
    }

    /// Completes when the runtime stops or the worker reaches a phase `ends`.
    async fn until(&mut self, ends: fn(Phase) -> bool) {
        let worker = async {
            match self.worker.as_mut() {
                // A closed channel (the worker's handle was dropped without a
                // shutdown) never ends the worker, as before handles existed.
                Some(phase) => {
                    if phase.wait_for(|p| ends(*p)).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.runtime.wait_for(|stopped| *stopped) => {}
            _ = worker => {}
        }
    }
}

impl Keiro {
    /// Shuts this runtime down cleanly: its resume workers stop claiming,
    /// every workflow it runs (resume workers' runs and `.start()`ed or
    /// awaited ones) stops at once and releases its lease, with journal,
    /// status and attempts untouched, so another worker resumes it right
    /// away instead of after the lease TTL; then the executor identity is
    /// given up (its heartbeat stops and its row is removed), so a new process
    /// may take it at once. Callers awaiting a stopped run get
    /// [`crate::Error::Stopped`].
    ///
    /// Afterwards this runtime runs no workflows ([`crate::Error::ShutDown`]);
    /// reading, enqueuing, cancelling and answering awakeables still work.
    /// Calling it again does nothing. Errors only when the store cannot be
    /// reached to give up the identity (it then lapses after 10 s, and the
    /// leases after their TTL).
    pub async fn shutdown(&self) -> Result<()> {
        if !self.signal_stop() {
            return Ok(());
        }
        // Runs see the signal at once; wait for them to hand back their
        // leases (each leaves `running` when it has).
        let deadline = tokio::time::Instant::now() + HALT_WAIT;
        while !self.inflight().is_idle() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let Some(registration) = self.registration() else {
            return Ok(());
        };
        // Removing the identity also releases any lease still held under it
        // (an instance created for a run that had not begun, a straggler).
        let released = self
            .raw_store()
            .remove_executor(&registration.id, &registration.token)
            .await?;
        tracing::info!(
            executor = %registration.id,
            released = released.unwrap_or(0),
            "keiro runtime shut down; executor identity given up"
        );
        Ok(())
    }
}
