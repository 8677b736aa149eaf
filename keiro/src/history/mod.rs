//! Histories: one workflow instance's input, journal and outcome as a JSON
//! document ([`History`]), exported with [`crate::Keiro::export`] (or
//! `keiro show ID --history`) and replayed against the current code with
//! [`crate::testing::replay`] and [`crate::Keiro::check`].
//!
//! A history kept as a test fixture makes `cargo test` catch a code change
//! that would break instances in flight:
//!
//! ```no_run
//! # #[keiro::workflow]
//! # async fn checkout(order: u64) -> u64 { order }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Saved with `keiro show order-42 --history --out tests/histories/order-42.json`.
//! let text = std::fs::read_to_string("tests/histories/order-42.json")?;
//! let history = keiro::History::from_json(&text)?;
//! keiro::testing::replay(&history, checkout).await?;
//! # Ok(()) }
//! ```
//!
//! Values (`input`, `output`, each entry's `result`) are kept as the exact
//! JSON text keiro journaled, so a replay decodes what production decoded;
//! a `History` therefore reads from JSON text (`serde_json::from_str`,
//! `from_slice`, `from_reader` or [`History::from_json`]), not from a
//! `serde_json::Value`.

mod export;
pub(crate) mod replay;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use keiro_store::{InstanceStatus, JournalEntry, StepRow};

pub use replay::{Divergence, ReplayError, ReplayStop, Replayed};

/// The history format this keiro writes and reads.
pub const HISTORY_FORMAT: u32 = 1;

/// One workflow instance as exported by [`crate::Keiro::export`]: what it was
/// called with, every journal entry of its current generation in order, and
/// how it ended (if it did).
///
/// Serializes to (and reads back from) JSON; reading a history of another
/// [`format`](History::format) than [`HISTORY_FORMAT`], or of a malformed
/// shape, is an error that says so.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct History {
    /// The format version ([`HISTORY_FORMAT`]).
    pub format: u32,
    /// The registered workflow name.
    pub workflow: String,
    /// The instance id.
    pub id: String,
    /// The generation the journal is of (continue-as-new bumps it).
    pub generation: i64,
    /// The workflow's argument and return types when the instance was
    /// created (`None` for instances older than signatures).
    pub signature: Option<String>,
    /// Its status when exported, as the store spells it: `pending`,
    /// `running`, `suspended`, `completed`, `failed`, `cancelled`,
    /// `timed_out` or `nondeterministic`.
    pub status: String,
    /// The arguments of this generation, as journaled (a JSON array, one
    /// element per argument; `null` for none).
    pub input: Box<RawValue>,
    /// The return value once it finished, as journaled (`null` until then).
    pub output: Option<Box<RawValue>>,
    /// Why it failed or was set aside, when it was.
    pub error: Option<String>,
    /// Every journal entry of the generation, in `seq` order.
    pub entries: Vec<HistoryEntry>,
}

/// One journal entry of a [`History`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HistoryEntry {
    /// Its sequence number in the run.
    pub seq: i64,
    /// What recorded it: `step`, `now`, `uuid`, `child`, `sleep`,
    /// `awakeable`, `recv`, `patch`, … (as [`crate::StepRecord::kind`]).
    pub kind: String,
    /// The step's name (a topic or key for messages, events and streams).
    pub name: String,
    /// The recorded result, exactly as journaled: for a `Result` the value
    /// or the error in `{"Ok":…}` / `{"Err":…}`, any other value as itself.
    pub result: Box<RawValue>,
    /// How many times a `#[step]`'s body ran to reach it, when known.
    pub attempts: Option<u32>,
    /// When a `#[step]`'s first attempt began (µs since the Unix epoch),
    /// when known.
    pub started_at_us: Option<i64>,
    /// When the entry was recorded (µs since the Unix epoch).
    pub recorded_at_us: i64,
}

/// Why a text is not a [`History`] this keiro reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// The history was written in a format this keiro does not read.
    #[error(
        "keiro history format {found} is not one this keiro reads (it reads format \
         {HISTORY_FORMAT}); export the history again with this keiro"
    )]
    UnknownFormat {
        /// The format the text declares.
        found: u64,
    },
    /// The text is not JSON, or not shaped like a history.
    #[error("not a keiro history: {0}")]
    Malformed(#[source] serde_json::Error),
}

impl History {
    /// Reads a history from JSON text: its `format` first (an unknown one is
    /// [`HistoryError::UnknownFormat`]), then its shape
    /// ([`HistoryError::Malformed`], naming where it is wrong).
    pub fn from_json(text: &str) -> Result<History, HistoryError> {
        #[derive(Deserialize)]
        struct Probe {
            format: Option<serde_json::Value>,
        }
        if let Ok(Probe {
            format: Some(format),
        }) = serde_json::from_str::<Probe>(text)
        {
            if let Some(found) = format.as_u64().filter(|f| *f != u64::from(HISTORY_FORMAT)) {
                return Err(HistoryError::UnknownFormat { found });
            }
        }
        serde_json::from_str(text).map_err(HistoryError::Malformed)
    }

    /// The history as pretty-printed JSON (what `keiro show ID --history`
    /// writes).
    pub fn to_json_pretty(&self) -> String {
        // Every field serializes infallibly: strings, numbers and JSON text.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The history of instance `row`'s current generation with its
    /// journal `entries`.
    pub(crate) fn of(row: &keiro_store::InstanceRow, entries: &[JournalEntry]) -> History {
        History {
            format: HISTORY_FORMAT,
            workflow: row.name.clone(),
            id: row.id.clone(),
            generation: row.generation,
            signature: row.signature.clone(),
            status: row.status.as_str().to_owned(),
            input: raw(&row.input),
            output: row.output.as_deref().map(raw),
            error: row.error.clone(),
            entries: entries.iter().map(HistoryEntry::of).collect(),
        }
    }

    /// The latest time the history shows passing (µs since the Unix
    /// epoch): when its last entry was recorded or its last step began.
    /// `None` for a history without entries.
    pub(crate) fn recorded_until_us(&self) -> Option<i64> {
        self.entries
            .iter()
            .map(|e| e.recorded_at_us.max(e.started_at_us.unwrap_or(i64::MIN)))
            .max()
    }

    /// The journal rows the history holds, as the store keeps them.
    pub(crate) fn step_rows(
        &self,
    ) -> impl Iterator<Item = (StepRow, keiro_store::StepTiming)> + '_ {
        self.entries.iter().map(|entry| {
            let row = StepRow {
                workflow_id: self.id.clone(),
                generation: self.generation,
                seq: entry.seq,
                name: entry.name.clone(),
                kind: entry.kind.clone(),
                result: entry.result.get().to_owned(),
            };
            let timing = keiro_store::StepTiming {
                attempts: entry.attempts,
                started_at: entry.started_at_us,
            };
            (row, timing)
        })
    }
}

impl HistoryEntry {
    fn of(entry: &JournalEntry) -> HistoryEntry {
        HistoryEntry {
            seq: entry.row.seq,
            kind: entry.row.kind.clone(),
            name: entry.row.name.clone(),
            result: raw(&entry.row.result),
            attempts: entry.attempts,
            started_at_us: entry.started_at,
            recorded_at_us: entry.recorded_at,
        }
    }
}

/// Stored JSON text as a raw value; text that is not JSON (which keiro never
/// journals) is kept as a JSON string, so the history stays valid JSON.
fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap_or_else(|_| {
        let quoted = serde_json::to_string(text).unwrap_or_else(|_| "null".to_owned());
        RawValue::from_string(quoted).unwrap_or_else(|_| null())
    })
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("`null` is JSON")
}

/// The shape read from JSON, checked before it becomes a [`History`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Unchecked {
    format: Format,
    workflow: String,
    id: String,
    generation: i64,
    signature: Option<String>,
    status: String,
    input: Box<RawValue>,
    output: Option<Box<RawValue>>,
    error: Option<String>,
    entries: Vec<HistoryEntry>,
}

/// A `format` field: refused at once when it is not [`HISTORY_FORMAT`], so
/// an unknown version is reported as such rather than as a shape error.
struct Format;

impl<'de> Deserialize<'de> for Format {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Format, D::Error> {
        let found = u64::deserialize(deserializer)?;
        if found != u64::from(HISTORY_FORMAT) {
            return Err(D::Error::custom(HistoryError::UnknownFormat { found }));
        }
        Ok(Format)
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<History, D::Error> {
        let history = Unchecked::deserialize(deserializer)?;
        // Checked while it was read.
        let Format = history.format;
        if InstanceStatus::parse(&history.status).is_none() {
            return Err(D::Error::custom(format!(
                "unknown status `{}`; a history's status is one of pending, running, \
                 suspended, completed, failed, cancelled, timed_out, nondeterministic",
                history.status
            )));
        }
        if let Some(pair) = history.entries.windows(2).find(|w| w[0].seq >= w[1].seq) {
            return Err(D::Error::custom(format!(
                "entry seq {} follows seq {}; entries are in increasing seq order, each once",
                pair[1].seq, pair[0].seq
            )));
        }
        if let Some(entry) = history.entries.iter().find(|e| e.seq < 0) {
            return Err(D::Error::custom(format!(
                "entry seq {} is negative; seqs count from 0",
                entry.seq
            )));
        }
        Ok(History {
            format: HISTORY_FORMAT,
            workflow: history.workflow,
            id: history.id,
            generation: history.generation,
            signature: history.signature,
            status: history.status,
            input: history.input,
            output: history.output,
            error: history.error,
            entries: history.entries,
        })
    }
}
