//! Traces across processes (feature `otel`): the `traceparent` of the span
//! that enqueues or starts a workflow is stored with the instance, and the
//! `keiro.workflow` span of every run, in this process or in a resume worker
//! of another, is its child. A stored value that is not a valid traceparent
//! is ignored: the workflow runs as usual under a root span.
//!
//! This process exports its spans to memory; the worker process
//! (`trace_worker`) writes its own to a file the test reads back.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use keiro::{Keiro, ResumeOptions, WorkflowStatus};
use keiro_admin_tests::otel::{
    install, read_spans, traced, traced_generations, traced_parent, ExportedSpan, SpanSink,
};
use keiro_store::NewInstance;
use keiro_tests::{on_both_backends, Backend, TestDb};
use opentelemetry::trace::TraceContextExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const WORKER: &str = env!("CARGO_BIN_EXE_trace_worker");

/// A root span's parent span id.
const NO_PARENT: &str = "0000000000000000";

/// The spans this process exported so far (the OpenTelemetry layer is
/// installed on first use, for every test of this binary).
fn exported() -> Vec<ExportedSpan> {
    static SPANS: OnceLock<Arc<Mutex<Vec<ExportedSpan>>>> = OnceLock::new();
    let spans = SPANS.get_or_init(|| {
        let spans = Arc::new(Mutex::new(Vec::new()));
        // Kept for the life of the process: its exporter is `spans`.
        std::mem::forget(install(SpanSink::Memory(spans.clone())));
        spans
    });
    spans.lock().unwrap().clone()
}

/// The `keiro.workflow` spans `spans` holds for instance `id`.
fn workflow_spans<'a>(spans: &'a [ExportedSpan], id: &str) -> Vec<&'a ExportedSpan> {
    spans
        .iter()
        .filter(|s| s.name == "keiro.workflow" && s.instance.as_deref() == Some(id))
        .collect()
}

/// An `http.request` span for instance `id`, with its trace id and span id
/// in hex.
fn open_span(id: &str) -> (tracing::Span, String, String) {
    let span = tracing::info_span!("http.request", request = %id);
    let cx = span.context();
    let ids = cx.span().span_context().clone();
    (span, ids.trace_id().to_string(), ids.span_id().to_string())
}

/// A fresh database and a runtime on it, with this process's spans exported.
async fn fresh(backend: Backend) -> (TestDb, Keiro) {
    exported();
    let db = TestDb::new(backend).await;
    let keiro = db.keiro().await;
    (db, keiro)
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn a_trace_crosses_into_a_worker_process(backend: Backend) {
    let (db, keiro) = fresh(backend).await;
    let id = unique("cross");
    let (request, trace_id, span_id) = open_span(&id);
    traced("a".into())
        .id(&id)
        .on(&keiro)
        .enqueue()
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    assert_eq!(
        keiro.summary(&id).await.unwrap().traceparent,
        Some(format!("00-{trace_id}-{span_id}-01")),
        "the enqueueing span's traceparent is stored with the instance"
    );

    // Process B runs it with a resume worker and writes its spans to a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("spans.jsonl");
    let run = tokio::process::Command::new(WORKER)
        .arg(&file)
        .arg(&id)
        .env("KEIRO_DATABASE_URL", &db.url)
        // One deployment: the worker runs the enqueuer's application version.
        .env(keiro::APP_VERSION_ENV, keiro.app_version())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the worker process ends within 60 s")
        .expect("run the worker process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("DONE Completed"),
        "worker: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        keiro
            .handle::<String>(&id)
            .await
            .unwrap()
            .result()
            .await
            .unwrap(),
        "hello a"
    );

    // One trace in both processes' exported spans.
    let ours = exported();
    let request = ours
        .iter()
        .find(|s| s.name == "http.request" && s.span_id == span_id)
        .expect("process A exported its request span");
    assert_eq!(request.trace_id, trace_id);
    let theirs = read_spans(&file);
    let runs = workflow_spans(&theirs, &id);
    assert_eq!(runs.len(), 1, "process B ran it once: {theirs:#?}");
    let run = runs[0];
    assert_eq!(run.trace_id, trace_id, "process B continues A's trace");
    assert_eq!(
        run.parent_span_id, span_id,
        "the workflow span's parent is A's request span"
    );
    // The step span B opened inside the run is in that trace too.
    let step = theirs
        .iter()
        .find(|s| s.name == "keiro.step")
        .expect("process B exported the step's span");
    assert_eq!(
        (step.trace_id.as_str(), step.parent_span_id.as_str()),
        (trace_id.as_str(), run.span_id.as_str())
    );
}

async fn a_started_workflow_and_its_child_continue_the_callers_trace(backend: Backend) {
    let (_db, keiro) = fresh(backend).await;
    let id = unique("start");
    let (request, trace_id, span_id) = open_span(&id);
    let out = async {
        let handle = traced_parent("b".into()).id(&id).on(&keiro).start().await?;
        handle.result().await
    }
    .instrument(request)
    .await
    .unwrap();
    assert_eq!(out, "hello b");
    let child_id = format!("{id}/0");
    let child = keiro.summary(&child_id).await.unwrap();
    let parent_runs = workflow_spans(&exported(), &id)
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert!(!parent_runs.is_empty(), "the parent's run was exported");
    for run in &parent_runs {
        assert_eq!(
            (run.trace_id.as_str(), run.parent_span_id.as_str()),
            (trace_id.as_str(), span_id.as_str()),
            "every run of the parent is a child of the caller's span"
        );
    }
    // The child was started inside the parent's first run: its runs are
    // children of that run's span.
    let spans = exported();
    let child_runs = workflow_spans(&spans, &child_id);
    assert!(!child_runs.is_empty(), "the child's run was exported");
    for run in child_runs {
        assert_eq!(run.trace_id, trace_id);
        assert!(
            parent_runs.iter().any(|p| p.span_id == run.parent_span_id),
            "the child's run {run:?} is a child of a parent run {parent_runs:?}"
        );
        assert_eq!(
            child.traceparent,
            Some(format!("00-{trace_id}-{}-01", run.parent_span_id))
        );
    }
}

async fn continue_as_new_keeps_the_trace(backend: Backend) {
    let (_db, keiro) = fresh(backend).await;
    let id = unique("generations");
    let (request, trace_id, span_id) = open_span(&id);
    let out = traced_generations(0)
        .id(&id)
        .on(&keiro)
        .into_future()
        .instrument(request)
        .await
        .unwrap();
    assert_eq!(out, 2);
    let summary = keiro.summary(&id).await.unwrap();
    assert_eq!(summary.generation, 2);
    assert_eq!(
        summary.traceparent,
        Some(format!("00-{trace_id}-{span_id}-01")),
        "continue-as-new keeps the stored traceparent"
    );
    let spans = exported();
    let runs = workflow_spans(&spans, &id);
    assert!(runs.len() >= 3, "a run per generation: {runs:#?}");
    for run in runs {
        assert_eq!(
            (run.trace_id.as_str(), run.parent_span_id.as_str()),
            (trace_id.as_str(), span_id.as_str()),
            "every generation's run is a child of the caller's span"
        );
    }
}

async fn malformed_stored_traceparents_are_ignored(backend: Backend) {
    let (_db, keiro) = fresh(backend).await;
    let malformed = [
        "not a traceparent",
        "00-00000000000000000000000000000000-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "",
    ];
    let ids: Vec<String> = malformed.iter().map(|_| unique("malformed")).collect();
    for (id, traceparent) in ids.iter().zip(malformed) {
        let new = NewInstance {
            traceparent: Some(traceparent),
            ..NewInstance::new(id, "traced", "[\"c\"]")
        };
        keiro::unstable::raw_store(&keiro)
            .create_instance(&new)
            .await
            .unwrap();
    }
    let worker = keiro
        .resume_worker(ResumeOptions::default().poll_interval(Duration::from_millis(50)))
        .await
        .unwrap();
    for (id, traceparent) in ids.iter().zip(malformed) {
        let handle = keiro.handle::<String>(id).await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(30), handle.result())
            .await
            .expect("it runs within 30 s");
        assert_eq!(out.unwrap(), "hello c", "traceparent {traceparent:?}");
        assert_eq!(handle.status().await.unwrap(), WorkflowStatus::Completed);
        assert_eq!(
            keiro.summary(id).await.unwrap().traceparent.as_deref(),
            Some(traceparent),
            "the stored value is shown as stored"
        );
        let spans = exported();
        let runs = workflow_spans(&spans, id);
        assert_eq!(runs.len(), 1, "traceparent {traceparent:?}");
        assert_eq!(
            runs[0].parent_span_id, NO_PARENT,
            "with traceparent {traceparent:?} the run is a root span"
        );
    }
    worker.shutdown().await;
}

async fn a_workflow_started_outside_any_span_stores_none(backend: Backend) {
    let (_db, keiro) = fresh(backend).await;
    let id = unique("untraced");
    let out = traced("d".into()).id(&id).on(&keiro).await.unwrap();
    assert_eq!(out, "hello d");
    assert_eq!(keiro.summary(&id).await.unwrap().traceparent, None);
}

on_both_backends!(
    a_trace_crosses_into_a_worker_process,
    a_started_workflow_and_its_child_continue_the_callers_trace,
    continue_as_new_keeps_the_trace,
    malformed_stored_traceparents_are_ignored,
    a_workflow_started_outside_any_span_stores_none,
);
