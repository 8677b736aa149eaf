//! How a workflow's step results reach the journal: each durable before its
//! step returns (strict, the default), or pipelined behind the workflow's
//! next steps until something leaves the workflow.

/// How a workflow journals its steps: `#[workflow(journal = "pipelined")]`
/// on one workflow, or [`KeiroBuilder::journal`](crate::KeiroBuilder::journal)
/// for every workflow of a runtime that does not say.
///
/// - [`Journal::Strict`] (the default): a step returns only once its row is
///   durable. After a crash only the step that was running runs again.
/// - [`Journal::Pipelined`]: a step (and `keiro::now()` / `keiro::uuid()`)
///   returns as soon as its row is queued, and the next step runs while it
///   commits; the rows queued meanwhile commit together, in order, in one
///   transaction, so the journal is always a prefix of the run. Before
///   anything leaves the workflow that the outside can observe through keiro
///   (an end other than its result, an awakeable id, a child started, a
///   message sent, an event or a stream value written, a wait that suspends
///   it) and before any other journaled operation, the run waits until every
///   queued row is durable. Its result instead commits together with the
///   rows still queued when it returns, in one transaction (neither without
///   the other). After a crash every step whose row was not yet durable runs
///   again: the at-least-once rule every step lives under, over the window
///   since the last durable row instead of the one running step.
///
/// A row that another executor recorded first (the run lost its lease)
/// stops a pipelined run before its next barrier instead of handing the
/// step the recorded result: the steps after it may have used the value
/// this run computed. No row behind it is journaled: neither those of the
/// same batch (the transaction that found it withdraws them) nor later
/// ones. If this process still holds the lease (the other run was a stale
/// one of the same instance), the run releases it, so the instance runs on
/// from its journal without waiting for the lease to lapse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Journal {
    /// Each step's row is durable before the step returns.
    #[default]
    Strict,
    /// Steps run ahead of their rows' commits; a barrier before anything
    /// observable.
    Pipelined,
}

impl Journal {
    /// The name `#[workflow(journal = "..")]` spells it with.
    pub fn as_str(self) -> &'static str {
        match self {
            Journal::Strict => "strict",
            Journal::Pipelined => "pipelined",
        }
    }
}

impl std::fmt::Display for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
