//! [`Keiro::export`]: an instance's [`History`], read from the store.

use super::History;
use crate::{Error, Keiro, Result};

impl Keiro {
    /// The [`History`] of instance `id`: its input, every journal entry of
    /// its current generation in order, its status and outcome. An unknown
    /// id is [`Error::NotFound`] naming it.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// let history = keiro.export("order-42").await?;
    /// std::fs::write("tests/histories/order-42.json", history.to_json_pretty())?;
    /// # Ok(()) }
    /// ```
    pub async fn export(&self, id: &str) -> Result<History> {
        Error::check_id("workflow id", id)?;
        let row = self
            .raw_store()
            .get_instance(id)
            .await?
            .ok_or_else(|| Error::NotFound { id: id.to_owned() })?;
        let entries = self
            .raw_store()
            .load_journal_entries(id, row.generation)
            .await?;
        Ok(History::of(&row, &entries))
    }
}
