//! A TCP proxy on 127.0.0.1 that a test can cut off: a network partition
//! between one process and its database, without touching either.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    Blackhole,
    Cut,
    Closed,
}

/// Forwards connections made to [`TcpProxy::addr`] to a target address until
/// told to [`blackhole`](TcpProxy::blackhole): then open connections stay open
/// but carry nothing either way (bytes already read are held back) and new
/// connections are closed at once, until [`resume`](TcpProxy::resume); or
/// [`cut`](TcpProxy::cut): open connections are closed too.
/// Dropping it closes everything.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accept: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `target` on a free port of 127.0.0.1.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (mode, _) = watch::channel(Mode::Forward);
        let modes = mode.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let current = *modes.borrow();
                match current {
                    Mode::Forward => {
                        tokio::spawn(connect(client, target, modes.subscribe()));
                    }
                    // Refused: closed before a byte is exchanged.
                    Mode::Blackhole | Mode::Cut => drop(client),
                    Mode::Closed => return,
                }
            }
        });
        TcpProxy { addr, mode, accept }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding: a partition.
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Closes every open connection and refuses new ones: a partition the
    /// client notices at once (its requests fail instead of hanging).
    pub fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    /// Forwards again (held bytes first, after a blackhole).
    pub fn resume(&self) {
        self.mode.send_replace(Mode::Forward);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Closed);
        self.accept.abort();
    }
}

async fn connect(client: TcpStream, target: SocketAddr, mode: watch::Receiver<Mode>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::spawn(pump(client_read, server_write, mode.clone()));
    tokio::spawn(pump(server_read, client_write, mode));
}

/// Copies `from` to `to` while the mode is `Forward`; returns when either side
/// closes or the proxy is dropped.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !forwarding(&mut mode).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            // Blackholed (or closed) while waiting to read: read nothing more.
            _ = mode.changed() => continue,
        };
        if !forwarding(&mut mode).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits until the mode is `Forward` (true) or `Cut` or `Closed` (false: the
/// connection ends).
async fn forwarding(mode: &mut watch::Receiver<Mode>) -> bool {
    let mode = mode
        .wait_for(|m| *m != Mode::Blackhole)
        .await
        .map(|m| *m)
        .unwrap_or(Mode::Closed);
    mode == Mode::Forward
}
