//! Repairing instances from outside: [`Keiro::retry`] runs a failed or
//! cancelled instance again from its journal, [`Keiro::fork`] starts a new
//! instance from a prefix of another's journal.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use crate::{Error, Keiro, Result};

/// Where [`Keiro::fork`] starts the new instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForkFrom {
    /// Copy the journal entries before this seq (the `n`-th recorded entry,
    /// counting from 0): the new instance replays them and runs the code from
    /// this entry on.
    Step(i64),
}

impl Keiro {
    /// Runs instance `id` again from its journal when it is failed (its crash
    /// attempts exhausted, or by an error keiro raised) or cancelled: its
    /// recorded steps are kept and not run again, its attempts reset, and a
    /// resume worker (in this process or another linking the workflow) runs
    /// it from there. Anything else (unfinished, completed, timed out, set
    /// aside, or failed because the workflow returned `Err`) is refused with
    /// [`Error::NotRetryable`] naming its status; an unknown id with
    /// [`Error::NotFound`]. A child runs again only while its parent still
    /// waits for it (its result is not in the parent's journal): its new
    /// result then reaches the parent as a first one would; a child whose
    /// parent recorded its result already is refused with
    /// [`Error::NotRetryable`] naming the parent (retry or fork the parent).
    /// An instance whose queue's dedup key another unfinished instance took
    /// since it ended is refused with [`Error::Duplicate`] naming that one.
    /// A retried instance is due at once: one cancelled while it waited
    /// for its `.delay(..)` does not wait out the rest of it.
    pub async fn retry(&self, id: &str) -> Result<()> {
        Error::check_id("workflow id", id)?;
        let retried = self.raw_store().retry(id).await;
        let status = match retried.map_err(Error::from_store)? {
            keiro_store::Retry::Retried => {
                tracing::info!(id, "keiro put a workflow back in line to retry it");
                self.wake_resume_worker();
                if let Err(error) = self.raw_store().wake_workers(id).await {
                    tracing::debug!(%error, "keiro could not notify workers of a retry");
                }
                return Ok(());
            }
            keiro_store::Retry::NotFound => return Err(Error::NotFound { id: id.to_owned() }),
            keiro_store::Retry::ReturnedError => {
                "failed because it returned `Err` (a replay returns it again)".to_owned()
            }
            keiro_store::Retry::NotRetryable(status) => status.as_str().to_owned(),
            keiro_store::Retry::ParentRecorded {
                status,
                parent_id,
                parent_name,
            } => format!(
                "{} but its parent `{parent_name}` (id {parent_id}) {}",
                status.as_str(),
                crate::error::PARENT_RECORDED
            ),
            _ => "in a state this version of keiro does not retry".to_owned(),
        };
        let name = self
            .raw_store()
            .get_instance(id)
            .await?
            .map_or_else(|| "?".to_owned(), |row| row.name);
        Err(Error::NotRetryable {
            name,
            id: id.to_owned(),
            status,
        })
    }

    /// Starts a new instance of `id`'s workflow with the same input and the
    /// entries of `id`'s current journal before `from` copied, run by the
    /// current code from there; `id` is left as it is. The fork is on
    /// `id`'s queue, with its priority and partition (not its dedup key), so
    /// the queue's limits hold for it. Awaiting the returned
    /// [`ForkCall`] returns the new instance's id, `"{id}-fork-{uuid}"`, or
    /// the id chosen with [`ForkCall::id`]:
    ///
    /// ```no_run
    /// # async fn demo(keiro: &keiro::Keiro) -> keiro::Result<()> {
    /// use keiro::ForkFrom;
    /// let generated = keiro.fork("order-42", ForkFrom::Step(3)).await?;
    /// let chosen = keiro.fork("order-42", ForkFrom::Step(3)).id("order-42-b").await?;
    /// assert_eq!(chosen, "order-42-b");
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::NotFound`] for an unknown `id`; a chosen id that is taken is
    /// [`Error::IdConflict`] and nothing is written.
    pub fn fork<'a>(&'a self, id: &'a str, from: ForkFrom) -> ForkCall<'a> {
        ForkCall {
            keiro: Some(self),
            id,
            from,
            new_id: None,
        }
    }

    /// [`Keiro::fork`] under the id `new_id`, the same as
    /// `keiro.fork(id, from).id(new_id)`; an instance that already has that
    /// id is refused with [`Error::IdConflict`] and nothing is written.
    pub async fn fork_as(&self, id: &str, from: ForkFrom, new_id: &str) -> Result<()> {
        Error::check_id("workflow id", id)?;
        Error::check_id("workflow id", new_id)?;
        let ForkFrom::Step(seq) = from;
        match self.raw_store().fork(id, seq, new_id).await? {
            keiro_store::Fork::Forked { steps } => {
                tracing::info!(id, new_id, seq, steps, "keiro forked a workflow");
                self.wake_resume_worker();
                if let Err(error) = self.raw_store().wake_workers(new_id).await {
                    tracing::debug!(%error, "keiro could not notify workers of a fork");
                }
                Ok(())
            }
            keiro_store::Fork::NotFound => Err(Error::NotFound { id: id.to_owned() }),
            _ => {
                let name = |row: Option<keiro_store::InstanceRow>| {
                    row.map_or_else(|| "?".to_owned(), |row| row.name)
                };
                Err(Error::IdConflict {
                    id: new_id.to_owned(),
                    existing: name(self.raw_store().get_instance(new_id).await?),
                    requested: name(self.raw_store().get_instance(id).await?),
                    held_as: String::new(),
                    requested_as: format!(" as a fork of instance `{id}`"),
                })
            }
        }
    }
}

/// Retries instance `id` through the process-wide runtime (see
/// [`Keiro::retry`]).
pub async fn retry(id: &str) -> Result<()> {
    crate::runtime::global().await?.retry(id).await
}

/// Forks instance `id` through the process-wide runtime (see
/// [`Keiro::fork`]): `keiro::fork(id, from).await`, or
/// `keiro::fork(id, from).id(new_id).await` to choose the new id.
pub fn fork(id: &str, from: ForkFrom) -> ForkCall<'_> {
    ForkCall {
        keiro: None,
        id,
        from,
        new_id: None,
    }
}

/// A fork about to be made ([`Keiro::fork`], [`fork`]): await it for the new
/// instance's id, after choosing that id with [`ForkCall::id`] if you like.
#[derive(Debug, Clone)]
#[must_use = "a fork is made only when awaited"]
pub struct ForkCall<'a> {
    /// The runtime to fork on; the process-wide one when `None`.
    keiro: Option<&'a Keiro>,
    id: &'a str,
    from: ForkFrom,
    new_id: Option<String>,
}

impl ForkCall<'_> {
    /// Gives the new instance the id `new_id` instead of
    /// `"{id}-fork-{uuid}"`. An instance that already has it is refused
    /// with [`Error::IdConflict`] and nothing is written.
    pub fn id(mut self, new_id: impl Into<String>) -> Self {
        self.new_id = Some(new_id.into());
        self
    }
}

impl<'a> IntoFuture for ForkCall<'a> {
    type Output = Result<String>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<String>> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let new_id = self
                .new_id
                .unwrap_or_else(|| format!("{}-fork-{}", self.id, uuid::Uuid::new_v4()));
            let global;
            let keiro = match self.keiro {
                Some(keiro) => keiro,
                None => {
                    global = crate::runtime::global().await?;
                    &global
                }
            };
            keiro.fork_as(self.id, self.from, &new_id).await?;
            Ok(new_id)
        })
    }
}
