//! OpenTelemetry for the trace tests: an SDK tracer provider whose exporter
//! keeps each ended span's ids (in memory, or as JSON lines in a file the
//! test reads back from a child process), installed as the global
//! `tracing` subscriber, and the workflow those tests run.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use keiro::{step, workflow};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Value;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;

/// One ended span, as the exporter keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedSpan {
    /// The span's name (`keiro.workflow`, `http.request`, ...).
    pub name: String,
    /// Its trace id, in hex.
    pub trace_id: String,
    /// Its span id, in hex.
    pub span_id: String,
    /// Its parent's span id, in hex (all zeros for a root span).
    pub parent_span_id: String,
    /// Its `id` attribute: the workflow instance id, on `keiro.workflow`.
    pub instance: Option<String>,
}

impl ExportedSpan {
    fn of(span: &SpanData) -> ExportedSpan {
        let instance = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "id")
            .map(|kv| match &kv.value {
                Value::String(text) => text.as_str().to_owned(),
                other => other.to_string(),
            });
        ExportedSpan {
            name: span.name.to_string(),
            trace_id: span.span_context.trace_id().to_string(),
            span_id: span.span_context.span_id().to_string(),
            parent_span_id: span.parent_span_id.to_string(),
            instance,
        }
    }
}

/// Where [`SpanLog`] puts the spans.
#[derive(Debug, Clone)]
pub enum SpanSink {
    /// Kept in this process.
    Memory(Arc<Mutex<Vec<ExportedSpan>>>),
    /// Appended to this file, one JSON object a line.
    File(PathBuf),
}

/// A span exporter keeping each span's ids ([`ExportedSpan`]).
#[derive(Debug, Clone)]
pub struct SpanLog {
    sink: SpanSink,
}

impl SpanExporter for SpanLog {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.iter().map(ExportedSpan::of);
        match &self.sink {
            SpanSink::Memory(kept) => kept.lock().unwrap().extend(spans),
            SpanSink::File(path) => {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .unwrap_or_else(|e| panic!("open span file {}: {e}", path.display()));
                for span in spans {
                    let line = serde_json::to_string(&span).expect("encode a span");
                    writeln!(file, "{line}").expect("write a span");
                }
                file.sync_all().expect("sync the span file");
            }
        }
        Ok(())
    }
}

/// Installs, as this process's global `tracing` subscriber, an
/// OpenTelemetry layer exporting every span to `sink` as it ends. Returns the
/// provider, to shut down (flush) before the process exits.
pub fn install(sink: SpanSink) -> SdkTracerProvider {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(SpanLog { sink })
        .build();
    let tracer = provider.tracer("keiro-tests");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber).expect("install the tracing subscriber");
    provider
}

/// Reads the spans a child process wrote to `path` ([`SpanSink::File`]).
pub fn read_spans(path: &std::path::Path) -> Vec<ExportedSpan> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("span line `{line}`: {e}"))
        })
        .collect()
}

/// The step of [`traced`].
#[step]
pub async fn greet(who: String) -> String {
    format!("hello {who}")
}

/// A one-step workflow whose runs the trace tests follow.
#[workflow]
pub async fn traced(who: String) -> String {
    greet(who).await
}

/// A workflow whose one child is [`traced`].
#[workflow]
pub async fn traced_parent(who: String) -> String {
    traced(who).await.unwrap_or_else(|error| error.to_string())
}

/// Continues as new until `n` reaches 2: three generations under one id.
#[workflow]
pub async fn traced_generations(n: u32) -> u32 {
    if n < 2 {
        return keiro::continue_as_new(traced_generations(n + 1))
            .await
            .unwrap_or(n);
    }
    n
}
