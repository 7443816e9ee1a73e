//! Accepting TCP connections and serving each one, with the ability to drop it.
//!
//! Why not `axum::serve`: two faults need a handler to act on its own
//! connection — `accept_then_reset` must cut it abruptly (an RST, via
//! `SO_LINGER` 0) and `accept_then_timeout` must close it without answering.
//! So every accepted socket gets its own hyper connection task (HTTP/1.1, or
//! HTTP/2 when the client opens with its preface), and every request on it
//! carries a [`ConnSignal`] (a request extension) through which the handler tells
//! that task to drop the connection — over HTTP/2 that drops every stream on it,
//! as a real server's reset would.
//!
//! The same loop serves the TLS listener ([`crate::Sandbox::serve_tls`]): each accepted
//! socket first meets the TLS faults (dropped or stalled before the handshake), then is
//! handshaken by rustls, then served exactly like a plain one — so every request-level
//! fault (a reset after the request, a timeout after accepting) also happens over TLS.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::Request;
use hyper::body::Incoming;
use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::injector::TlsFault;
use crate::state::State;

/// Streams one HTTP/2 connection may carry at once: more than any test or bench keeps
/// in flight (hyper's default, 200, would queue a worker's 1,000 calls to a slow
/// provider in the client).
const MAX_STREAMS: u32 = 4096;
/// How long open connections may finish their requests after shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest a client may take over its side of the handshake, and longest a stalled
/// handshake is held.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(30);

/// A served connection: plain TCP or TLS over it (the TCP socket is needed to reset).
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn tcp(&self) -> &TcpStream;
}

impl Socket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Socket for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// What the TLS listener needs: the handshake config and the faults to apply first.
#[derive(Clone)]
pub(crate) struct TlsSide {
    pub acceptor: TlsAcceptor,
    pub state: Arc<State>,
}

/// How a handler wants its connection to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Abort {
    /// Close quietly (FIN), no response.
    Close,
    /// Close abruptly (RST), no response.
    Reset,
}

/// A handler's line to the task serving its connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnSignal(Arc<watch::Sender<Option<Abort>>>);

impl ConnSignal {
    /// Close the connection without answering.
    pub fn close(&self) {
        self.0.send_replace(Some(Abort::Close));
    }

    /// Reset the connection without answering.
    pub fn reset(&self) {
        self.0.send_replace(Some(Abort::Reset));
    }
}

/// Resolves once shutdown was requested (or the requester is gone).
pub(crate) async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Serves `listener` until `shutdown` flips, then drains connections.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsSide>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    match &tls {
                        None => {
                            conns.spawn(serve_connection(stream, router.clone(), shutdown.clone()));
                        }
                        Some(tls) => {
                            conns.spawn(serve_tls(stream, tls.clone(), router.clone(), shutdown.clone()));
                        }
                    }
                }
                Err(e) => {
                    // Typically EMFILE; back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = shutdown_requested(&mut shutdown) => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        conns.abort_all();
    }
    tracing::debug!("accept loop stopped");
}

/// The TLS faults, the handshake, then [`serve_connection`].
async fn serve_tls(
    stream: TcpStream,
    tls: TlsSide,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    match tls.state.tls_fault() {
        Some(TlsFault::Drop) => return,
        Some(TlsFault::Stall) => {
            // Hold the socket unread until the client gives up (or we stop).
            let _ = tokio::time::timeout(HANDSHAKE_LIMIT, shutdown_requested(&mut shutdown)).await;
            drop(stream);
            return;
        }
        None => {}
    }
    match tokio::time::timeout(HANDSHAKE_LIMIT, tls.acceptor.accept(stream)).await {
        Ok(Ok(secured)) => serve_connection(secured, router, shutdown).await,
        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake timed out"),
    }
}

async fn serve_connection<S: Socket>(
    stream: S,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.tcp().set_nodelay(true);
    // A second handle on the socket, to reset it: hyper's HTTP/2 connection (and the
    // auto one) does not hand its socket back. SO_LINGER is the socket's, whichever
    // handle sets it; the RST goes out when the last handle closes.
    let handle = socket2::SockRef::from(stream.tcp()).try_clone();
    let (tx, mut abort) = watch::channel(None);
    let signal = ConnSignal(Arc::new(tx));
    let tower = TowerToHyperService::new(router);
    let service = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(signal.clone());
        tower.call(req)
    });
    // HTTP/1.1, or HTTP/2 when the client starts with its preface (h2c by prior
    // knowledge, or after ALPN picked `h2` on the TLS listener).
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .title_case_headers(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    let mut draining = false;
    loop {
        tokio::select! {
            done = &mut conn => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            changed = abort.changed() => {
                let action = *abort.borrow();
                match (changed, action) {
                    (Ok(()), Some(Abort::Reset)) => {
                        let zero = handle
                            .as_ref()
                            .map_err(|e| e.to_string())
                            .and_then(|h| h.set_linger(Some(Duration::ZERO)).map_err(|e| e.to_string()));
                        if let Err(e) = zero {
                            tracing::debug!(error = %e, "SO_LINGER 0 failed; plain close");
                        }
                        return;
                    }
                    (Ok(()), Some(Abort::Close)) | (Err(_), _) => return,
                    (Ok(()), None) => {}
                }
            }
            () = shutdown_requested(&mut shutdown), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
                grace.as_mut().reset(tokio::time::Instant::now() + SHUTDOWN_GRACE);
            }
            () = &mut grace, if draining => return,
        }
    }
}
