//! The admin console with Prometheus metrics beside it, in one server.
//!
//! ```text
//! KEIRO_ADMIN_TOKEN=change-me cargo run -p keiro-examples --example console_metrics
//! # console:  http://127.0.0.1:7878/        (operations need the token)
//! # metrics:  curl -s http://127.0.0.1:7878/metrics
//! ```
//!
//! It installs `metrics-exporter-prometheus` as the process's metrics
//! recorder, runs a few orders (one of them fails) so the counters have
//! something to say, starts a resume worker, and serves
//! `keiro::admin::router` with a `/metrics` route next to it. With no
//! `KEIRO_DATABASE_URL` it uses `console_metrics.db` in the working
//! directory. `--listen ADDR` picks another address; Ctrl-C stops it.

use std::net::SocketAddr;

use axum::routing::get;
use keiro::{step, workflow, Keiro, ResumeOptions};
use metrics_exporter_prometheus::PrometheusBuilder;

#[step]
async fn price(sku: String) -> Result<u64, String> {
    match sku.as_str() {
        "unknown" => Err(format!("no price for `{sku}`")),
        _ => Ok(sku.len() as u64 * 100),
    }
}

#[step]
async fn invoice(amount: u64) -> String {
    format!("invoice for {amount} cents")
}

/// Prices an order and writes its invoice.
#[workflow]
async fn order(sku: String) -> Result<String, String> {
    let amount = price(sku).await?;
    Ok(invoice(amount).await)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen: SocketAddr = match std::env::args().skip_while(|a| a != "--listen").nth(1) {
        Some(address) => address.parse()?,
        None => "127.0.0.1:7878".parse()?,
    };
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let url = std::env::var(keiro::DATABASE_URL_ENV)
        .unwrap_or_else(|_| "sqlite:console_metrics.db".to_owned());
    let keiro = Keiro::connect(&url).await?;
    for sku in ["apple", "pear", "unknown"] {
        let id = format!("order-{sku}");
        let result = order(sku.to_owned()).id(&id).on(&keiro).await?;
        println!("{id}: {result:?}");
    }
    let worker = keiro.resume_worker(ResumeOptions::default()).await?;

    let app = keiro::admin::router(keiro.clone()).route(
        "/metrics",
        get(move || std::future::ready(prometheus.render())),
    );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("console on http://{listen}/ and metrics on http://{listen}/metrics");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    worker.shutdown().await;
    Ok(())
}
