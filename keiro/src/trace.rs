//! Traces across processes: the W3C `traceparent` of the span that starts or
//! enqueues a workflow is stored with its instance, and every run of the
//! instance, in this process or in a resume worker of another one, opens its
//! `keiro.workflow` span as a child of that span. A request's trace so goes
//! on through whichever worker runs the workflow, however much later.
//!
//! This needs the cargo feature `otel` and a subscriber with a
//! `tracing-opentelemetry` layer, in both the process that starts the
//! workflow and the one that runs it. Without the feature nothing is read or
//! stored; with it, an instance started outside any OpenTelemetry span
//! stores nothing (NULL), and its runs open root spans as before.

#[cfg(feature = "otel")]
pub(crate) use otel::{adopt, current_traceparent};

/// The `traceparent` of the current span's OpenTelemetry context: always
/// `None` without the `otel` feature.
#[cfg(not(feature = "otel"))]
#[inline]
pub(crate) fn current_traceparent() -> Option<String> {
    None
}

/// Makes `traceparent` the parent of `span`: nothing without the `otel`
/// feature.
#[cfg(not(feature = "otel"))]
#[inline]
pub(crate) fn adopt(_span: &tracing::Span, _traceparent: &str, _id: &str) {}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::{OpenTelemetrySpanExt, SetParentError};

    /// The W3C Trace Context header (and carrier key) keiro stores.
    const TRACEPARENT: &str = "traceparent";

    /// The `traceparent` of the current span's OpenTelemetry context, or
    /// `None` when there is no current span, no OpenTelemetry layer, or no
    /// valid context.
    pub(crate) fn current_traceparent() -> Option<String> {
        let span = tracing::Span::current();
        if span.is_disabled() {
            return None;
        }
        let cx = span.context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = Injected(None);
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        carrier.0
    }

    /// Makes the span `traceparent` names the parent of `span` (not yet
    /// entered), for instance `id`. A malformed value is ignored with a debug
    /// log: the run goes on under a root span.
    pub(crate) fn adopt(span: &tracing::Span, traceparent: &str, id: &str) {
        let cx = TraceContextPropagator::new().extract(&Stored(traceparent));
        if !cx.span().span_context().is_valid() {
            tracing::debug!(
                id,
                traceparent,
                "keiro ignores the malformed traceparent stored with a workflow instance"
            );
            return;
        }
        match span.set_parent(cx) {
            // The span is filtered out: there is nothing to continue.
            Ok(()) | Err(SetParentError::SpanDisabled) => {}
            Err(error) => {
                tracing::debug!(id, %error, "keiro could not continue a workflow instance's trace")
            }
        }
    }

    /// A carrier keeping only the `traceparent` header injected into it.
    struct Injected(Option<String>);

    impl Injector for Injected {
        fn set(&mut self, key: &str, value: String) {
            if key == TRACEPARENT {
                self.0 = Some(value);
            }
        }
    }

    /// A carrier holding a stored `traceparent` header, to extract.
    struct Stored<'a>(&'a str);

    impl Extractor for Stored<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            match key {
                TRACEPARENT => Some(self.0),
                _ => None,
            }
        }

        fn keys(&self) -> Vec<&str> {
            vec![TRACEPARENT]
        }
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::{adopt, current_traceparent};

    /// Runs `f` under a subscriber with an OpenTelemetry layer.
    fn traced<T>(f: impl FnOnce() -> T) -> T {
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("keiro-trace"));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f)
    }

    #[test]
    fn the_current_spans_traceparent_round_trips() {
        traced(|| {
            assert_eq!(current_traceparent(), None, "no span, no traceparent");
            let request = tracing::info_span!("request");
            let ids = request.context().span().span_context().clone();
            let traceparent = request.in_scope(current_traceparent).unwrap();
            assert_eq!(
                traceparent,
                format!("00-{}-{}-01", ids.trace_id(), ids.span_id())
            );
            let run = tracing::info_span!(parent: None, "keiro.workflow");
            adopt(&run, &traceparent, "wf-1");
            assert_eq!(
                run.context().span().span_context().trace_id(),
                ids.trace_id()
            );
        });
    }

    #[test]
    fn a_malformed_traceparent_leaves_a_root_span() {
        traced(|| {
            for malformed in [
                "",
                "garbage",
                "00-00000000000000000000000000000000-0000000000000000-01",
            ] {
                let run = tracing::info_span!(parent: None, "keiro.workflow");
                adopt(&run, malformed, "wf-2");
                let other = tracing::info_span!(parent: None, "other");
                assert!(run.context().span().span_context().is_valid());
                assert_ne!(
                    run.context().span().span_context().trace_id(),
                    other.context().span().span_context().trace_id(),
                    "{malformed:?} started no trace"
                );
            }
        });
    }
}
