//! The runtime's metrics through the `metrics` facade: steps executed and
//! replayed, run outcomes, and a resume pass's gauges — labelled by names and
//! outcomes only, never by ids — and, on PostgreSQL, the clock's offset.

use std::time::Duration;

use keiro::{step, telemetry, workflow, ResumeOptions};
use keiro_tests::{Backend, TestDb};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

#[step]
async fn metered(n: u32) -> u32 {
    n + 1
}

#[workflow]
async fn metered_flow(n: u32) -> u32 {
    let a = metered(n).await;
    let approval = keiro::awakeable::<bool>().await;
    let approved = approval.await.unwrap_or(false);
    a + u32::from(approved)
}

/// A metric's name, labels and value.
type Reading = (String, Vec<(String, String)>, f64);

/// One reading of every metric: (name, labels, value). Reading resets the
/// recorder's counters, so take one per phase.
fn read(snapshotter: &Snapshotter) -> Vec<Reading> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            (key.name().to_owned(), labels, value)
        })
        .collect()
}

fn value(reading: &[Reading], name: &str, labels: &[(&str, &str)]) -> f64 {
    reading
        .iter()
        .filter(|(n, ls, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_runs_and_passes_are_measured_with_bounded_labels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("install the debugging recorder");

    let db = TestDb::new(Backend::Sqlite).await;
    let keiro = keiro::Keiro::builder(&db.url)
        .executor_id("metrics-test")
        .suspend_after(Duration::from_millis(20))
        .connect()
        .await
        .unwrap();
    let quiet = ResumeOptions::default().log(|_| {});
    // The first pass runs the step and suspends on the awakeable.
    metered_flow(1)
        .id("m-1")
        .on(&keiro)
        .enqueue()
        .await
        .unwrap();
    keiro.resume_once(&quiet).await.unwrap();
    let first = read(&snapshotter);
    let executed = [("step", "metered"), ("outcome", "executed")];
    assert_eq!(value(&first, telemetry::STEPS, &executed), 1.0);
    let suspended = [("workflow", "metered_flow"), ("outcome", "suspended")];
    assert_eq!(value(&first, telemetry::RUNS, &suspended), 1.0);
    assert_eq!(value(&first, telemetry::RESUMED, &[]), 1.0);
    assert_eq!(value(&first, telemetry::AWAKEABLES_PENDING, &[]), 1.0);

    // The answer makes it due; the second pass replays the step and finishes.
    let awakeable = keiro::unstable::raw_store(&keiro)
        .get_step("m-1", 0, 1)
        .await
        .unwrap()
        .expect("the awakeable's creation is journaled");
    let created: serde_json::Value = serde_json::from_str(&awakeable.result).unwrap();
    let secret = created["secret"].as_str().unwrap();
    keiro
        .resolve_awakeable(&format!("m-1/0/1/{secret}"), true)
        .await
        .unwrap();
    keiro.resume_once(&quiet).await.unwrap();
    let second = read(&snapshotter);
    let replayed = [("step", "metered"), ("outcome", "replayed")];
    assert_eq!(value(&second, telemetry::STEPS, &replayed), 1.0);
    let completed = [("workflow", "metered_flow"), ("outcome", "completed")];
    assert_eq!(value(&second, telemetry::RUNS, &completed), 1.0);
    assert_eq!(value(&second, telemetry::AWAKEABLES_PENDING, &[]), 0.0);

    // No metric carries an instance id.
    for (name, labels, _) in first.iter().chain(&second) {
        for (_, v) in labels {
            assert!(!v.contains("m-1"), "{name} carries an id: {labels:?}");
        }
    }

    // SQLite has no second clock to be off; a PostgreSQL runtime reads the
    // server's as it takes its identity (this server shares the host's).
    let offset = |reading: &[Reading]| {
        reading
            .iter()
            .find(|(name, _, _)| name == telemetry::CLOCK_OFFSET)
            .map(|(_, _, value)| *value)
    };
    assert_eq!(offset(&first), None, "a clock offset on SQLite");
    let db = TestDb::new(Backend::Postgres).await;
    let keiro = keiro::Keiro::connect(&db.url).await.unwrap();
    keiro.resume_once(&quiet).await.unwrap();
    let measured = offset(&read(&snapshotter)).expect("no clock offset on PostgreSQL");
    // Within a reading's uncertainty on a loaded machine.
    assert!(measured.abs() < 0.5, "{measured} s off the server's clock");
}
