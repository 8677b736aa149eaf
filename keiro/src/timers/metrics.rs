//! The names of the metrics the timer worker records through the
//! [`metrics`](https://docs.rs/metrics) facade.
//!
//! Install any `metrics` recorder (Prometheus, OpenTelemetry, ...) to export
//! them; with none installed they cost nothing. Labels are bounded: the
//! process manager name and the outcome, never a timer id, correlation id or
//! reason (those go on the `keiro.timer.fire` span).

/// Histogram, seconds: how late a timer was claimed after its fire time.
/// Label: [`LABEL_PROCESS_MANAGER`].
pub const FIRE_LAG_SECONDS: &str = "keiro_timer_fire_lag_seconds";
/// Histogram: a claimed timer's attempt count, this claim included.
/// Label: [`LABEL_PROCESS_MANAGER`].
pub const ATTEMPTS: &str = "keiro_timer_attempts";
/// Counter: claimed timers by what became of them.
/// Labels: [`LABEL_PROCESS_MANAGER`], [`LABEL_OUTCOME`] (`completed`, `retry`,
/// `dead_letter`, `not_mine`, `attempt_ceiling`, `superseded`).
pub const FIRES_TOTAL: &str = "keiro_timer_fires_total";
/// Gauge: timers due and not yet claimed, as a worker pass began.
pub const BACKLOG: &str = "keiro_timer_backlog";
/// Gauge: timers still `firing` under claims taken before a worker pass began.
pub const STUCK: &str = "keiro_timer_stuck";
/// Counter: stale `firing` claims requeued by worker passes.
pub const REQUEUED_TOTAL: &str = "keiro_timer_requeued_total";
/// Counter: lapsed foreground resume claims recovered to dead.
pub const RESUMES_RECOVERED_TOTAL: &str = "keiro_timer_resumes_recovered_total";

/// The label naming a timer's process manager.
pub const LABEL_PROCESS_MANAGER: &str = "process_manager";
/// The label naming what became of a claimed timer.
pub const LABEL_OUTCOME: &str = "outcome";

/// Describes every metric to the installed recorder (units and help text).
pub(crate) fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        FIRE_LAG_SECONDS,
        Unit::Seconds,
        "How late keiro timers were claimed after their fire time"
    );
    describe_histogram!(
        ATTEMPTS,
        Unit::Count,
        "Attempt count of each claimed keiro timer"
    );
    describe_counter!(FIRES_TOTAL, Unit::Count, "Claimed keiro timers by outcome");
    describe_gauge!(BACKLOG, Unit::Count, "keiro timers due and not yet claimed");
    describe_gauge!(
        STUCK,
        Unit::Count,
        "keiro timers firing under claims older than the current worker pass"
    );
    describe_counter!(
        REQUEUED_TOTAL,
        Unit::Count,
        "Stale keiro timer claims requeued"
    );
    describe_counter!(
        RESUMES_RECOVERED_TOTAL,
        Unit::Count,
        "Lapsed keiro timer resume claims recovered to dead"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};

    use ::metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };

    use crate::timers::{FireOutcome, TimerRequest, TimerRow, TimerWorkerOptions, Timers};

    /// One recorded value: kind, name, labels, value.
    type Entry = (&'static str, String, Vec<(String, String)>, f64);

    #[derive(Default)]
    struct Capture(Arc<Mutex<Vec<Entry>>>);

    struct Handle {
        kind: &'static str,
        key: Key,
        log: Arc<Mutex<Vec<Entry>>>,
    }

    impl Handle {
        fn push(&self, value: f64) {
            let labels = self
                .key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let name = self.key.name().to_owned();
            self.log
                .lock()
                .unwrap()
                .push((self.kind, name, labels, value));
        }
    }

    impl CounterFn for Handle {
        fn increment(&self, value: u64) {
            self.push(value as f64)
        }
        fn absolute(&self, value: u64) {
            self.push(value as f64)
        }
    }

    impl GaugeFn for Handle {
        fn increment(&self, value: f64) {
            self.push(value)
        }
        fn decrement(&self, value: f64) {
            self.push(-value)
        }
        fn set(&self, value: f64) {
            self.push(value)
        }
    }

    impl HistogramFn for Handle {
        fn record(&self, value: f64) {
            self.push(value)
        }
    }

    impl Capture {
        fn handle(&self, kind: &'static str, key: &Key) -> Arc<Handle> {
            Arc::new(Handle {
                kind,
                key: key.clone(),
                log: self.0.clone(),
            })
        }
    }

    impl Recorder for Capture {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.handle("counter", key))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(self.handle("gauge", key))
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.handle("histogram", key))
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A span's name and the fields recorded on it.
    type SpanLog = (String, Vec<(String, String)>);

    /// Every span opened.
    #[derive(Default, Clone)]
    struct Spans(Arc<Mutex<Vec<SpanLog>>>);

    struct Fields<'a>(&'a mut Vec<(String, String)>);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            self.0.push((field.name().to_owned(), value.to_owned()));
        }
    }

    impl tracing::Subscriber for Spans {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut fields = Vec::new();
            span.record(&mut Fields(&mut fields));
            let mut spans = self.0.lock().unwrap();
            spans.push((span.metadata().name().to_owned(), fields));
            tracing::span::Id::from_u64(spans.len() as u64)
        }
        fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
            let mut spans = self.0.lock().unwrap();
            let span = &mut spans[id.into_u64() as usize - 1];
            values.record(&mut Fields(&mut span.1));
        }
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    // A current-thread runtime, so the thread-local recorder sees every metric.
    #[tokio::test(flavor = "current_thread")]
    async fn a_drain_records_bounded_metrics_and_a_span_per_fire() {
        let capture = Capture::default();
        let _guard = ::metrics::set_default_local_recorder(&capture);
        let spans = Spans::default();
        let _tracing = tracing::subscriber::set_default(spans.clone());
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("m.db").display());
        let timers = Timers::connect(&url).await.unwrap();
        let due = SystemTime::now() - Duration::from_secs(2);
        for id in ["order-1/timeout", "order-2/timeout"] {
            timers
                .schedule(&TimerRequest::new(id, "checkout", id, due))
                .await
                .unwrap();
        }
        let summary = timers
            .drain(
                &TimerWorkerOptions::default(),
                10,
                |timer: TimerRow| async move {
                    if timer.id.as_str() == "order-1/timeout" {
                        FireOutcome::completed("ev")
                    } else {
                        FireOutcome::failed_permanently("order-2 is gone")
                    }
                },
            )
            .await
            .unwrap();
        assert_eq!(summary.processed, 2);

        let log = capture.0.lock().unwrap().clone();
        let find = |kind: &str, name: &str| -> Vec<&Entry> {
            log.iter().filter(|e| e.0 == kind && e.1 == name).collect()
        };
        let backlog = find("gauge", super::BACKLOG);
        assert_eq!(backlog.len(), 1);
        assert_eq!((backlog[0].2.clone(), backlog[0].3), (vec![], 2.0));
        assert_eq!(find("gauge", super::STUCK)[0].3, 0.0);
        let lags = find("histogram", super::FIRE_LAG_SECONDS);
        assert_eq!(lags.len(), 2);
        for lag in &lags {
            assert_eq!(lag.2, labels(&[("process_manager", "checkout")]));
            assert!(lag.3 >= 1.9, "the timers were two seconds late: {}", lag.3);
        }
        let attempts = find("histogram", super::ATTEMPTS);
        assert!(attempts.iter().all(|a| a.3 == 1.0));
        let mut fires: Vec<Vec<(String, String)>> = find("counter", super::FIRES_TOTAL)
            .iter()
            .map(|e| e.2.clone())
            .collect();
        fires.sort();
        assert_eq!(
            fires,
            vec![
                labels(&[("process_manager", "checkout"), ("outcome", "completed")]),
                labels(&[("process_manager", "checkout"), ("outcome", "dead_letter")]),
            ]
        );
        // One span per fire names the timer and what became of it.
        let spans = spans.0.lock().unwrap().clone();
        let fires: Vec<_> = spans
            .iter()
            .filter(|(name, _)| name == "keiro.timer.fire")
            .collect();
        assert_eq!(fires.len(), 2);
        let field = |span: &SpanLog, name: &str| {
            span.1
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let failed = fires
            .iter()
            .find(|s| field(s, "timer.id").as_deref() == Some("order-2/timeout"))
            .expect("a span names the timer");
        assert_eq!(
            field(failed, "timer.process_manager").as_deref(),
            Some("checkout")
        );
        assert_eq!(field(failed, "timer.attempts").as_deref(), Some("1"));
        assert_eq!(
            field(failed, "timer.outcome").as_deref(),
            Some("dead_letter")
        );
        assert_eq!(
            field(failed, "timer.reason").as_deref(),
            Some("order-2 is gone")
        );

        // Ids, correlation ids and reasons never become label values.
        for entry in &log {
            for (_, value) in &entry.2 {
                assert!(!value.contains("order-"), "unbounded label in {entry:?}");
            }
        }
    }
}
