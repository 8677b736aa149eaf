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
        let mut carrier = Traceparent(None);
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        carrier.0
    }

    /// Makes the span `traceparent` names the parent of `span` (not yet
    /// entered), for instance `id`. A malformed value is ignored with a debug
    /// log: the run goes on under a root span.
    pub(crate) fn adopt(span: &tracing::Span, traceparent: &str, id: &str) {
        let cx = TraceContextPropagator::new().extract(&Traceparent(Some(traceparent.to_owned())));
        if !cx.span().span_context().is_valid() {
            tracing::debug!(
                id,
                traceparent,
                "keiro ignores the malformed traceparent stored with a workflow instance"
            );
            return;
        }
        match span.set_parent(cx) {
            // No OpenTelemetry layer here, or the span is filtered out.
            Ok(()) | Err(SetParentError::SpanDisabled) => {}
            Err(error) => {
                tracing::debug!(id, %error, "keiro could not continue a workflow instance's trace")
            }
        }
    }

    /// A carrier holding only the `traceparent` header.
    struct Traceparent(Option<String>);

    impl Injector for Traceparent {
        fn set(&mut self, key: &str, value: String) {
            if key == TRACEPARENT {
                self.0 = Some(value);
            }
        }
    }

    impl Extractor for Traceparent {
        fn get(&self, key: &str) -> Option<&str> {
            match key {
                TRACEPARENT => self.0.as_deref(),
                _ => None,
            }
        }

        fn keys(&self) -> Vec<&str> {
            vec![TRACEPARENT]
        }
    }
}
