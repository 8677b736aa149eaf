//! Group commit: one writer task per store batches concurrent step writes.

use tokio::sync::{mpsc, oneshot};

use crate::{AppendOutcome, Result, StepRow, Store, StoreError};

/// The most step rows one shared transaction carries.
const MAX_BATCH: usize = 1024;

struct Request {
    row: StepRow,
    reply: oneshot::Sender<Result<AppendOutcome>>,
}

/// Commits step rows in shared transactions.
///
/// It never waits to fill a batch: each commit carries whatever queued while
/// the previous one was in flight, so a lone workflow pays one commit per step
/// and a thousand concurrent steps pay a handful. [`JournalWriter::append`]
/// returns only once the row is durable.
#[derive(Debug, Clone)]
pub struct JournalWriter {
    sender: mpsc::UnboundedSender<Request>,
}

impl JournalWriter {
    /// Starts the writer task on the current tokio runtime. It stops when every
    /// clone of the returned handle is dropped.
    pub fn spawn(store: Store) -> JournalWriter {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(store, receiver));
        JournalWriter { sender }
    }

    /// Records one step result and waits until it is committed. If the step id
    /// was already recorded, the first result wins and is returned.
    pub async fn append(&self, row: StepRow) -> Result<AppendOutcome> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Request { row, reply })
            .map_err(|_| StoreError::WriterStopped)?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }
}

async fn run(store: Store, mut receiver: mpsc::UnboundedReceiver<Request>) {
    let mut batch: Vec<Request> = Vec::new();
    let mut rows: Vec<StepRow> = Vec::new();
    while let Some(first) = receiver.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        rows.extend(batch.iter().map(|r| r.row.clone()));
        let result = store.append_steps(&rows).await;
        rows.clear();
        match result {
            Ok(outcomes) => {
                for (request, outcome) in batch.drain(..).zip(outcomes) {
                    let _ = request.reply.send(Ok(outcome));
                }
            }
            Err(error) => {
                tracing::warn!(%error, rows = batch.len(), "keiro journal batch failed");
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(error.clone()));
                }
            }
        }
    }
}
