//! What a workflow publishes for the outside while it runs: events (the last
//! value set under a key: progress, a status, an intermediate result) and
//! streams (append-only, ordered values: log lines, tokens, rows).
//!
//! Each write is journaled with its value in one transaction, so it happens
//! exactly once; readers outside see it as soon as it commits.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use keiro_store::{AppendOutcome, Publish, StepRow};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{claim_seq, halt, Halt, StepKind, WorkflowContext};
use crate::error::TypeMismatch;
use crate::registry::BoxFuture;
use crate::{Error, Keiro, Result};

/// How long a reader waits between looks at the store at first; it doubles
/// while nothing changes, up to [`READ_POLL_MAX`].
const READ_POLL_MIN: Duration = Duration::from_millis(10);
const READ_POLL_MAX: Duration = Duration::from_millis(250);

/// How many stream entries one read fetches.
const STREAM_PAGE: i64 = 256;

/// Sets event `key` of the current workflow to `value` (the last value
/// wins), readable from outside with [`get_event`] as soon as this returns.
/// Journaled: a replay sets nothing again. Outside a workflow it is
/// [`Error::NotInWorkflow`].
///
/// ```no_run
/// #[keiro::workflow]
/// async fn import(rows: u32) -> Result<(), String> {
///     for done in (0..=rows).step_by(100) {
///         keiro::set_event("progress", &done).await.map_err(|e| e.to_string())?;
///     }
///     Ok(())
/// }
/// ```
pub fn set_event<T: Serialize + ?Sized>(
    key: impl Into<String>,
    value: &T,
) -> impl Future<Output = Result<()>> + Send {
    let key = key.into();
    let encoded = crate::json::to_json(value, || format!("the value of event `{key}`"));
    let type_name = std::any::type_name::<T>();
    let slot = claim_seq();
    async move {
        let Some((cx, seq)) = slot else {
            return Err(not_in_workflow(format!("keiro::set_event(\"{key}\")")));
        };
        publish(&cx, seq, StepKind::Event, &key, Some(encoded?), type_name).await
    }
}

/// Appends `value` to stream `key` of the current workflow, readable from
/// outside with [`read_stream`] as soon as this returns. Journaled: a replay
/// appends nothing again. A write after [`close_stream`] is ignored.
pub fn write_stream<T: Serialize + ?Sized>(
    key: impl Into<String>,
    value: &T,
) -> impl Future<Output = Result<()>> + Send {
    let key = key.into();
    let encoded = crate::json::to_json(value, || format!("a value for stream `{key}`"));
    let type_name = std::any::type_name::<T>();
    let slot = claim_seq();
    async move {
        let Some((cx, seq)) = slot else {
            return Err(not_in_workflow(format!("keiro::write_stream(\"{key}\")")));
        };
        publish(&cx, seq, StepKind::Stream, &key, Some(encoded?), type_name).await
    }
}

/// Closes stream `key` of the current workflow: readers end after its last
/// value. A workflow's streams also end, for readers, when it ends.
pub fn close_stream(key: impl Into<String>) -> impl Future<Output = Result<()>> + Send {
    let key = key.into();
    let slot = claim_seq();
    async move {
        let Some((cx, seq)) = slot else {
            return Err(not_in_workflow(format!("keiro::close_stream(\"{key}\")")));
        };
        publish(&cx, seq, StepKind::Stream, &key, None, "").await
    }
}

fn not_in_workflow(op: String) -> Error {
    Error::NotInWorkflow {
        op,
        instead: "events and streams belong to a workflow instance; read them from outside \
                  with keiro::get_event / keiro::read_stream",
    }
}

/// Journals step `seq` with an event or stream value, or checks the replayed
/// row.
async fn publish(
    cx: &Arc<WorkflowContext>,
    seq: i64,
    kind: StepKind,
    key: &str,
    value: Option<String>,
    type_name: &'static str,
) -> Result<()> {
    let what = match kind {
        StepKind::Event => "event key",
        _ => "stream key",
    };
    Error::check_id(what, key)?;
    if let Some(json) = &value {
        crate::json::check_size(
            json,
            cx.keiro.max_payload_bytes(),
            &cx.name,
            &cx.id,
            || match kind {
                StepKind::Event => format!("the value of event `{key}`"),
                _ => format!("a value for stream `{key}`"),
            },
        )?;
    }
    let row = match cx.recorded(seq) {
        Some(row) => row,
        None => {
            let step = StepRow {
                workflow_id: cx.id.clone(),
                generation: cx.generation,
                seq,
                name: key.to_owned(),
                kind: kind.as_str().to_owned(),
                result: "null".to_owned(),
            };
            let publish = Publish {
                step: &step,
                key,
                value: value.as_deref(),
                type_name: value.is_some().then_some(type_name),
            };
            super::pipeline::barrier(cx).await;
            let store = cx.keiro.raw_store();
            let written = match kind {
                StepKind::Event => store.set_event(&publish).await,
                _ => store.write_stream(&publish).await,
            };
            match written {
                Ok(AppendOutcome::Inserted) => return Ok(()),
                Ok(AppendOutcome::Existing(first)) => first,
                Err(e) => return halt(cx, Halt::Error(Error::Store(e))).await,
            }
        }
    };
    if row.kind != kind.as_str() || row.name != key {
        let found = super::describe(kind.as_str(), key);
        return Err(cx.non_deterministic(seq, &row, found));
    }
    Ok(())
}

/// Reads event `key` of workflow instance `workflow_id` through the
/// process-wide runtime (or [`GetEvent::on`]'s): `.await` it for
/// `Result<Option<T>, Error>` (`None` until the workflow sets it), or
/// [`GetEvent::wait`] for it to be set. A value that does not decode into `T`
/// is [`Error::MessageType`] naming both types.
pub fn get_event<T: DeserializeOwned + Send + 'static>(
    workflow_id: impl Into<String>,
    key: impl Into<String>,
) -> GetEvent<T> {
    GetEvent {
        workflow_id: workflow_id.into(),
        key: key.into(),
        wait: None,
        keiro: None,
        slot: claim_seq(),
        _value: PhantomData,
    }
}

/// A read of an event ([`get_event`]); `.await` it.
#[must_use = "reading an event does nothing until it is awaited"]
pub struct GetEvent<T> {
    workflow_id: String,
    key: String,
    wait: Option<Duration>,
    keiro: Option<Keiro>,
    slot: Option<(Arc<WorkflowContext>, i64)>,
    _value: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for GetEvent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetEvent")
            .field("workflow_id", &self.workflow_id)
            .field("key", &self.key)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl<T> GetEvent<T> {
    /// Waits up to `duration` for the event to be set (returns at once when
    /// it is); `None` when it is still unset then.
    pub fn wait(mut self, duration: Duration) -> Self {
        self.wait = Some(duration);
        self
    }

    /// Reads through `keiro` instead of the process-wide runtime.
    pub fn on(mut self, keiro: &Keiro) -> Self {
        self.keiro = Some(keiro.clone());
        self
    }
}

impl<T: DeserializeOwned + Send + 'static> IntoFuture for GetEvent<T> {
    type Output = Result<Option<T>>;
    type IntoFuture = BoxFuture<'static, Result<Option<T>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Some((cx, seq)) = self.slot.clone() else {
                let keiro = match &self.keiro {
                    Some(keiro) => keiro.clone(),
                    None => crate::runtime::global().await?,
                };
                let raw = read_event(&keiro, &self.workflow_id, &self.key, self.wait).await?;
                return raw
                    .map(|(value, type_name)| self.decode(&value, type_name))
                    .transpose();
            };
            // Inside a workflow the value read is journaled: a replay sees it.
            let name = format!("event {}", self.key);
            let row = match cx.recorded(seq) {
                Some(row) => row,
                None => {
                    let raw = match read_event(&cx.keiro, &self.workflow_id, &self.key, self.wait)
                        .await
                    {
                        Ok(raw) => raw,
                        Err(Error::Store(e)) => {
                            return halt(&cx, Halt::Error(Error::Store(e))).await
                        }
                        Err(other) => return Err(other),
                    };
                    let row = StepRow {
                        workflow_id: cx.id.clone(),
                        generation: cx.generation,
                        seq,
                        name: name.clone(),
                        kind: StepKind::GetEvent.as_str().to_owned(),
                        result: raw.map_or_else(|| "null".to_owned(), |(value, _)| value),
                    };
                    super::pipeline::barrier(&cx).await;
                    match cx.keiro.writer().append(row.clone()).await {
                        Ok(AppendOutcome::Inserted) => row,
                        Ok(AppendOutcome::Existing(first)) => first,
                        Err(e) => return halt(&cx, Halt::Error(Error::Store(e))).await,
                    }
                }
            };
            if row.kind != StepKind::GetEvent.as_str() || row.name != name {
                let found = super::describe(StepKind::GetEvent.as_str(), &name);
                return Err(cx.non_deterministic(seq, &row, found));
            }
            if row.result == "null" {
                return Ok(None);
            }
            self.decode(&row.result, None).map(Some)
        })
    }
}

impl<T: DeserializeOwned> GetEvent<T> {
    fn decode(&self, value: &str, type_name: Option<String>) -> Result<T> {
        let what = format!("event `{}`", self.key);
        decode_published(&self.workflow_id, what, value, type_name)
    }
}

/// Reads event `key` of instance `id` (its value and writer's type), waiting
/// up to `wait` for it to be set; `None` when unset then. An unknown id is
/// [`Error::NotFound`].
async fn read_event(
    keiro: &Keiro,
    id: &str,
    key: &str,
    wait: Option<Duration>,
) -> Result<Option<(String, Option<String>)>> {
    Error::check_id("workflow id", id)?;
    Error::check_id("event key", key)?;
    let store = keiro.raw_store();
    let deadline = tokio::time::Instant::now() + wait.unwrap_or_default();
    let mut nap = READ_POLL_MIN;
    loop {
        if let Some(event) = store.get_event(id, key).await? {
            return Ok(Some((event.value, event.type_name)));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            if store.get_instance(id).await?.is_none() {
                return Err(Error::NotFound { id: id.to_owned() });
            }
            return Ok(None);
        }
        tokio::time::sleep(nap.min(deadline - now)).await;
        nap = (nap * 2).min(READ_POLL_MAX);
    }
}

/// Inside a workflow, a stream's values as journaled steps: each item read
/// (a value, or the end) is journaled when first read, so a replay yields
/// the same items without reading the stream again.
fn journaled_stream<T: DeserializeOwned + Send + 'static>(
    cx: Arc<WorkflowContext>,
    id: String,
    key: String,
) -> impl Stream<Item = Result<T>> + Send {
    struct Reading {
        cx: Arc<WorkflowContext>,
        id: String,
        key: String,
        position: i64,
        done: bool,
    }
    let reading = Reading {
        cx,
        id,
        key,
        position: 0,
        done: false,
    };
    futures::stream::unfold(reading, |mut r| async move {
        if r.done {
            return None;
        }
        let seq = r.cx.next_seq();
        let name = format!("stream {}", r.key);
        let kind = StepKind::ReadStream;
        let row = match r.cx.recorded(seq) {
            Some(row) => row,
            None => {
                let read = next_entry(&r.cx.keiro, &r.id, &r.key, r.position).await;
                let result = match read {
                    Ok(Some((value, _))) => format!("{{\"Ok\":{value}}}"),
                    Ok(None) => "{\"Err\":\"end\"}".to_owned(),
                    Err(Error::Store(e)) => return halt(&r.cx, Halt::Error(Error::Store(e))).await,
                    Err(other) => {
                        r.done = true;
                        return Some((Err(other), r));
                    }
                };
                let row = StepRow {
                    workflow_id: r.cx.id.clone(),
                    generation: r.cx.generation,
                    seq,
                    name: name.clone(),
                    kind: kind.as_str().to_owned(),
                    result,
                };
                super::pipeline::barrier(&r.cx).await;
                match r.cx.keiro.writer().append(row.clone()).await {
                    Ok(AppendOutcome::Inserted) => row,
                    Ok(AppendOutcome::Existing(first)) => first,
                    Err(e) => return halt(&r.cx, Halt::Error(Error::Store(e))).await,
                }
            }
        };
        if row.kind != kind.as_str() || row.name != name {
            r.done = true;
            let found = super::describe(kind.as_str(), &name);
            return Some((Err(r.cx.non_deterministic(seq, &row, found)), r));
        }
        match keiro_store::Outcome::decode_as::<T, String>(&row.result) {
            Ok(Ok(value)) => {
                r.position += 1;
                Some((Ok(value), r))
            }
            Ok(Err(_)) => None,
            Err(e) => {
                r.done = true;
                let what = format!("entry {} of stream `{}`", r.position, r.key);
                let error = decode_published::<T>(&r.id, what, &row.result, None)
                    .err()
                    .unwrap_or_else(|| Error::decode("a journaled stream entry", e));
                Some((Err(error), r))
            }
        }
    })
}

/// The entry of stream `key` of instance `id` at `position` (its value and
/// writer's type), waiting until it is written; `None` at the stream's end
/// (closed, or the workflow ended with no entry there).
async fn next_entry(
    keiro: &Keiro,
    id: &str,
    key: &str,
    position: i64,
) -> Result<Option<(String, Option<String>)>> {
    Error::check_id("workflow id", id)?;
    Error::check_id("stream key", key)?;
    let store = keiro.raw_store();
    let mut nap = READ_POLL_MIN;
    loop {
        let ended = match store.get_instance(id).await? {
            Some(row) => row.status.is_final(),
            None => return Err(Error::NotFound { id: id.to_owned() }),
        };
        if let Some(entry) = store.read_stream(id, key, position, 1).await?.pop() {
            return Ok(entry.value.map(|value| (value, entry.type_name)));
        }
        if ended {
            return Ok(None);
        }
        tokio::time::sleep(nap).await;
        nap = (nap * 2).min(READ_POLL_MAX);
    }
}

/// Decodes a published value, or says which types differ.
fn decode_published<T: DeserializeOwned>(
    id: &str,
    what: String,
    value: &str,
    type_name: Option<String>,
) -> Result<T> {
    serde_json::from_str(value).map_err(|e| {
        Error::MessageType(Box::new(TypeMismatch {
            what,
            workflow: None,
            id: id.to_owned(),
            expected: std::any::type_name::<T>().to_owned(),
            found: type_name.unwrap_or_else(|| "(unnamed type)".into()),
            reason: e.to_string(),
        }))
    })
}

/// Reads stream `key` of workflow instance `workflow_id` through the
/// process-wide runtime: every value in order, from the first, ending after
/// the stream is closed or the workflow has ended. Values not yet written are
/// waited for. An item that does not decode into `T` is an
/// [`Error::MessageType`] item. Inside a workflow each item read (a value, or
/// the end) is journaled as a step, so a replay yields the same items.
pub fn read_stream<T: DeserializeOwned + Send + 'static>(
    workflow_id: impl Into<String>,
    key: impl Into<String>,
) -> StreamReader<T> {
    StreamReader::new(None, workflow_id.into(), key.into())
}

impl Keiro {
    /// [`get_event`] through this runtime.
    pub fn get_event<T: DeserializeOwned + Send + 'static>(
        &self,
        workflow_id: impl Into<String>,
        key: impl Into<String>,
    ) -> GetEvent<T> {
        get_event(workflow_id, key).on(self)
    }

    /// [`read_stream`] through this runtime.
    pub fn read_stream<T: DeserializeOwned + Send + 'static>(
        &self,
        workflow_id: impl Into<String>,
        key: impl Into<String>,
    ) -> StreamReader<T> {
        StreamReader::new(Some(self.clone()), workflow_id.into(), key.into())
    }
}

/// The values of a workflow's stream ([`read_stream`]), as a
/// [`futures::Stream`] of `Result<T, Error>`.
#[must_use = "a stream reader reads nothing until it is polled"]
pub struct StreamReader<T> {
    inner: Pin<Box<dyn Stream<Item = Result<T>> + Send>>,
}

impl<T> std::fmt::Debug for StreamReader<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamReader").finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned + Send + 'static> StreamReader<T> {
    fn new(keiro: Option<Keiro>, id: String, key: String) -> StreamReader<T> {
        struct State {
            keiro: Option<Keiro>,
            id: String,
            key: String,
            next: i64,
            buffered: std::collections::VecDeque<keiro_store::StreamEntry>,
            nap: Duration,
            done: bool,
        }
        let (id_for_journal, key_for_journal) = (id.clone(), key.clone());
        let state = State {
            keiro,
            id,
            key,
            next: 0,
            buffered: Default::default(),
            nap: READ_POLL_MIN,
            done: super::current().is_some(),
        };
        let inside_workflow = state.done;
        let values = futures::stream::unfold(state, |mut s| async move {
            loop {
                if s.done {
                    return None;
                }
                if let Some(entry) = s.buffered.pop_front() {
                    s.next = entry.position + 1;
                    // A value-less entry closes the stream.
                    let value = entry.value?;
                    let what = format!("entry {} of stream `{}`", entry.position, s.key);
                    let item = decode_published(&s.id, what, &value, entry.type_name);
                    return Some((item, s));
                }
                let keiro = match &s.keiro {
                    Some(keiro) => keiro.clone(),
                    None => match crate::runtime::global().await {
                        Ok(keiro) => {
                            s.keiro = Some(keiro.clone());
                            keiro
                        }
                        Err(e) => {
                            s.done = true;
                            return Some((Err(e), s));
                        }
                    },
                };
                if let Err(e) = Error::check_id("workflow id", &s.id)
                    .and_then(|()| Error::check_id("stream key", &s.key))
                {
                    s.done = true;
                    return Some((Err(e), s));
                }
                let store = keiro.raw_store();
                // Whether the workflow had ended *before* this read: then an
                // empty read means nothing more will come.
                let ended = match store.get_instance(&s.id).await {
                    Ok(Some(row)) => row.status.is_final(),
                    Ok(None) => {
                        s.done = true;
                        return Some((Err(Error::NotFound { id: s.id.clone() }), s));
                    }
                    Err(e) => {
                        s.done = true;
                        return Some((Err(Error::Store(e)), s));
                    }
                };
                match store.read_stream(&s.id, &s.key, s.next, STREAM_PAGE).await {
                    Ok(entries) if !entries.is_empty() => {
                        s.buffered.extend(entries);
                        s.nap = READ_POLL_MIN;
                    }
                    Ok(_) if ended => return None,
                    Ok(_) => {
                        tokio::time::sleep(s.nap).await;
                        s.nap = (s.nap * 2).min(READ_POLL_MAX);
                    }
                    Err(e) => {
                        s.done = true;
                        return Some((Err(Error::Store(e)), s));
                    }
                }
            }
        });
        let inner: Pin<Box<dyn Stream<Item = Result<T>> + Send>> = match super::current() {
            Some(cx) if inside_workflow => {
                Box::pin(journaled_stream(cx, id_for_journal, key_for_journal))
            }
            _ => Box::pin(values),
        };
        StreamReader { inner }
    }
}

impl<T> Stream for StreamReader<T> {
    type Item = Result<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
