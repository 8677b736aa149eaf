//! One trace across two processes. Process A opens an `http.request` span
//! and enqueues a workflow inside it; keiro stores the span's W3C
//! `traceparent` with the instance. A then starts process B (this binary
//! again, with `--worker`), whose resume worker runs the workflow: B's
//! `keiro.workflow` span is a child of A's request span, in the same trace.
//! Both processes export their spans to stdout with the OpenTelemetry SDK
//! (B's lines are shown prefixed with `B |`: its `keiro.workflow` span's
//! `ParentSpanId` is A's request span), and A prints the trace id they share.
//!
//! ```text
//! cargo run -p keiro-examples --example trace_two_processes
//! ```
//!
//! With no `KEIRO_DATABASE_URL` both use `keiro.db` in the working directory
//! (created if missing); a `postgres://` URL works the same. Traces need
//! keiro's cargo feature `otel` (the examples crate enables it) and a
//! `tracing-opentelemetry` layer in each process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use keiro::{step, workflow, ResumeOptions};
use opentelemetry::trace::{TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// What process B prints before the trace id its step runs in.
const TRACE_LINE: &str = "worker: the step runs in trace ";

#[step]
async fn reserve(order: String) -> String {
    // The step's span is inside the run's `keiro.workflow` span.
    println!("{TRACE_LINE}{}", trace_id_of(&tracing::Span::current()));
    format!("{order} reserved")
}

#[workflow]
async fn fulfil(order: String) -> String {
    reserve(order).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => request().await,
        [flag, id] if flag == "--worker" => worker(id).await,
        _ => Err(
            format!("usage: trace_two_processes [--worker <instance id>] (got {args:?})").into(),
        ),
    }
}

/// Process A: a request span that enqueues the workflow, then process B.
async fn request() -> Result<(), Box<dyn std::error::Error>> {
    let provider = export_to_stdout("trace-example-request");
    let keiro = keiro::global().await?;
    let order = format!("order-{}", keiro::Uuid::new_v4().simple());
    let id = format!("fulfil-{order}");
    let span = tracing::info_span!("http.request", order = %order);
    let ids = span.context().span().span_context().clone();
    let trace_id = ids.trace_id();
    println!(
        "request: span `http.request` {} in trace {trace_id} enqueues {id}",
        ids.span_id()
    );
    fulfil(order)
        .id(&id)
        .on(&keiro)
        .enqueue()
        .instrument(span.clone())
        .await?;
    drop(span); // ends the request span: A exports it now
    keiro.shutdown().await?;

    let mut child = Command::new(std::env::current_exe()?)
        .args(["--worker", &id])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut worker_trace = None;
    for line in BufReader::new(child.stdout.take().expect("piped stdout")).lines() {
        let line = line?;
        if let Some(trace) = line.strip_prefix(TRACE_LINE) {
            worker_trace = Some(trace.to_owned());
        }
        println!("B | {line}");
    }
    let status = child.wait()?;
    provider.shutdown()?;
    if !status.success() {
        return Err(format!("the worker process failed: {status}").into());
    }
    match worker_trace {
        Some(trace) if trace == trace_id.to_string() => {
            println!("one trace across two processes: {trace_id}");
            Ok(())
        }
        other => Err(format!("the worker ran in trace {other:?}, not {trace_id}").into()),
    }
}

/// Process B: a resume worker that runs instance `id` to its end.
async fn worker(id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let provider = export_to_stdout("trace-example-worker");
    let keiro = keiro::global().await?;
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(100)))
        .await?;
    let out = keiro.handle::<String>(id).await?.result().await?;
    println!("worker: {id} returned {out:?}");
    worker.shutdown().await;
    keiro.shutdown().await?;
    provider.shutdown()?;
    Ok(())
}

/// Installs a `tracing` subscriber whose OpenTelemetry layer prints every
/// span to stdout as it ends, for service `service`.
fn export_to_stdout(service: &'static str) -> SdkTracerProvider {
    let provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(service).build())
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer(service));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
        .expect("no other tracing subscriber is installed");
    provider
}

/// The trace id of `span`'s OpenTelemetry context.
fn trace_id_of(span: &tracing::Span) -> TraceId {
    span.context().span().span_context().trace_id()
}
