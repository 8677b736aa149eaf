//! Messages to running workflows.
//!
//! - `message_latency`: a message is sent and the receiving workflow's next
//!   step starts. The sender puts its wall clock (µs) in the message just
//!   before `send`; the step after `recv` subtracts it from the clock as its
//!   body starts (same machine, same clock). The receiver waits in memory.
//!   On PostgreSQL the sender is another process (its `NOTIFY` wakes the
//!   receiver's listener); on SQLite, which has no cross-process push, it is
//!   another task of the receiving process (the in-process notification).
//! - `message_throughput`: 10,000 messages to 100 workflows that each
//!   receive 100, sent by 16 concurrent tasks; messages per second from the
//!   first send until every receiver has finished.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use keiro::{Keiro, SqliteSynchronous};
use tokio::sync::mpsc;

use crate::common::{
    builder, now_us, percentile, random_below, read_stdin_line, reply, stdin_lines, sync_name,
    with_fresh_db, Backend, BenchResult, ChildProc, Config, Figure,
};
use crate::workflows::{message_probe, message_sink};

/// Measured latency samples.
const SAMPLES: u32 = 200;
/// Unmeasured samples first.
const WARMUP: u32 = 10;
/// Receivers and messages of `message_throughput`.
const SINKS: u32 = 100;
const PER_SINK: u32 = 100;
const SENDERS: u32 = 16;

static LATENCIES: Mutex<Option<mpsc::UnboundedSender<i64>>> = Mutex::new(None);

/// Called by the probe's step after `recv`: the message's age as it starts.
pub(crate) fn received(sent_at_us: i64) {
    let age = now_us() - sent_at_us;
    if let Some(tx) = LATENCIES.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        let _ = tx.send(age);
    }
}

/// The `message_latency` workload.
pub(crate) async fn message_latency(cfg: &Config) -> BenchResult {
    let samples =
        with_fresh_db(cfg.backend, |db| async move { latency(cfg, &db.url).await }).await?;
    let (variant, what) = match cfg.backend {
        Backend::Postgres => (
            "cross_process_notify",
            "sender in another process; receiver waiting in memory, woken by the NOTIFY \
             through its process's listener; until the step after recv starts",
        ),
        Backend::Sqlite => (
            "in_process",
            "sender another task of the receiving process; receiver waiting in memory, woken \
             by the in-process notification; until the step after recv starts",
        ),
    };
    for (stat, p) in [("p50", 50.0), ("p99", 99.0)] {
        cfg.emit(
            Figure::new("message_latency", percentile(&samples, p), "ms")
                .with("variant", variant)
                .with("stat", stat)
                .with("samples", samples.len())
                .with("what", what),
        );
    }
    Ok(())
}

async fn latency(cfg: &Config, url: &str) -> BenchResult<Vec<f64>> {
    let (tx, mut ages) = mpsc::unbounded_channel();
    *LATENCIES.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    let keiro = cfg
        .builder(url)
        .suspend_after(Duration::from_secs(60))
        .connect()
        .await?;
    let id = format!("msg-probe-{}", uuid::Uuid::new_v4().simple());
    let total = WARMUP + SAMPLES;
    let handle = message_probe(total).id(&id).on(&keiro).start().await?;
    let mut sender = match cfg.backend {
        Backend::Postgres => {
            let mut child = ChildProc::spawn(&["message-sender", url, sync_name(cfg.sync)], &[])?;
            child
                .line_starting("READY", Duration::from_secs(30))
                .await?;
            Some(child)
        }
        Backend::Sqlite => None,
    };
    let mut samples = Vec::with_capacity(SAMPLES as usize);
    for n in 0..total {
        // A random phase, so the receiver is back in `recv` and waiting.
        tokio::time::sleep(Duration::from_millis(2) + random_below(Duration::from_millis(8))).await;
        match sender.as_mut() {
            Some(child) => {
                child.send(&id).await?;
                child.line_starting("SENT", Duration::from_secs(10)).await?;
            }
            None => keiro.send(&id, "m", &now_us()).await?,
        }
        let age = tokio::time::timeout(Duration::from_secs(10), ages.recv())
            .await
            .map_err(|_| crate::common::fail("a message was not received within 10 s"))?
            .ok_or_else(|| crate::common::fail("the probe stopped reporting"))?;
        if n >= WARMUP {
            samples.push(age as f64 / 1000.0);
        }
    }
    handle.result().await?.map_err(crate::common::fail)?;
    if let Some(child) = sender {
        child.finish().await?;
    }
    keiro.store().close().await;
    Ok(samples)
}

/// The child that sends the latency probe's messages: one per stdin line
/// (the receiver's id), stamped with the clock just before sending.
pub(crate) async fn child_sender(url: &str, sync: SqliteSynchronous) -> BenchResult {
    let keiro: Keiro = builder(url, sync).connect().await?;
    reply("READY");
    let mut lines = stdin_lines();
    while let Some(id) = read_stdin_line(&mut lines).await? {
        keiro.send(id.trim(), "m", &now_us()).await?;
        reply("SENT");
    }
    keiro.store().close().await;
    Ok(())
}

/// The `message_throughput` workload.
pub(crate) async fn message_throughput(cfg: &Config) -> BenchResult {
    let (rate, elapsed) = with_fresh_db(
        cfg.backend,
        |db| async move { throughput(cfg, &db.url).await },
    )
    .await?;
    cfg.emit(
        Figure::new("message_throughput", rate, "msgs/s")
            .with("messages", SINKS * PER_SINK)
            .with("receivers", SINKS)
            .with("senders", SENDERS)
            .with("seconds", crate::common::round3(elapsed))
            .with(
                "what",
                "16 tasks send 10,000 messages to 100 running workflows that each recv 100; \
                 from the first send until every receiver has returned",
            ),
    );
    Ok(())
}

async fn throughput(cfg: &Config, url: &str) -> BenchResult<(f64, f64)> {
    let keiro = cfg
        .builder(url)
        .suspend_after(Duration::from_secs(60))
        .connect()
        .await?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut handles = Vec::new();
    for n in 0..SINKS {
        let id = format!("sink-{run}-{n}");
        handles.push(message_sink(PER_SINK).id(&id).on(&keiro).start().await?);
    }
    let started = Instant::now();
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let keiro = keiro.clone();
        let run = run.clone();
        senders.push(tokio::spawn(async move {
            let mut m = s;
            while m < SINKS * PER_SINK {
                let id = format!("sink-{run}-{}", m % SINKS);
                keiro.send(&id, "m", &m).await?;
                m += SENDERS;
            }
            Ok::<(), keiro::Error>(())
        }));
    }
    for sender in senders {
        sender.await??;
    }
    for handle in handles {
        let got = handle.result().await?;
        if got != PER_SINK {
            return Err(crate::common::fail(format!(
                "a sink received {got} messages"
            )));
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    keiro.store().close().await;
    Ok((f64::from(SINKS * PER_SINK) / elapsed, elapsed))
}
