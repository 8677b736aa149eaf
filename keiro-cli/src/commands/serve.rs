//! `keiro serve`: the admin HTTP API and web console on their own.

use std::io::Write;

use keiro::admin::{Admin, ADMIN_TOKEN_ENV};
use keiro::Keiro;
use serde_json::json;

use crate::args::ServeArgs;
use crate::{Failure, Report};

/// Serves `keiro::admin` on `args.listen` until Ctrl-C or SIGTERM. The
/// address (with the port picked, for port 0) is printed on stdout as soon
/// as the socket listens, so a script can wait for that line.
pub(crate) async fn run(keiro: &Keiro, args: &ServeArgs) -> Result<Report, Failure> {
    let admin = Admin::new(keiro.clone());
    let writable = admin.allows_changes();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|error| Failure::Refused(format!("cannot listen on {}: {error}", args.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|error| Failure::Refused(format!("cannot read the listening address: {error}")))?;
    let url = format!("http://{address}/");
    // Listen for the signals before saying we are up, so a SIGTERM sent
    // right after that line stops the server instead of killing it.
    let stop = stopped()?;
    let mode = if writable {
        "operations need the token in KEIRO_ADMIN_TOKEN".to_owned()
    } else {
        format!("read-only: set {ADMIN_TOKEN_ENV} to allow operations")
    };
    {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "keiro console on {url} ({mode})");
        let _ = stdout.flush();
    }
    axum::serve(listener, admin.router())
        .with_graceful_shutdown(stop)
        .await
        .map_err(|error| Failure::Refused(format!("the console server failed: {error}")))?;
    Ok(Report {
        human: "stopped\n".to_owned(),
        json: json!({ "stopped": url }),
    })
}

/// A future that resolves on Ctrl-C or SIGTERM; the handlers are
/// installed when this returns, not when the future is first polled.
fn stopped() -> Result<impl std::future::Future<Output = ()>, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|error| Failure::Refused(format!("cannot listen for {name}: {error}")))
    };
    let mut interrupt = listen(SignalKind::interrupt(), "Ctrl-C")?;
    let mut terminate = listen(SignalKind::terminate(), "SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
