//! Accepting TCP connections and serving each one, with the ability to drop it.
//!
//! Why not `axum::serve`: two faults need a handler to act on its own
//! connection — `accept_then_reset` must cut it abruptly (an RST, via
//! `SO_LINGER` 0) and `accept_then_timeout` must close it without answering.
//! So every accepted socket gets its own hyper HTTP/1 connection task, and
//! every request on it carries a [`ConnSignal`] (a request extension) through
//! which the handler tells that task to drop the connection.
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
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::injector::TlsFault;
use crate::state::State;

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
    let (tx, mut abort) = watch::channel(None);
    let signal = ConnSignal(Arc::new(tx));
    let tower = TowerToHyperService::new(router);
    let service = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(signal.clone());
        tower.call(req)
    });
    let mut conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service);
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
                        let parts = conn.into_parts();
                        if let Err(e) = parts.io.inner().tcp().set_zero_linger() {
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
                std::pin::Pin::new(&mut conn).graceful_shutdown();
                grace.as_mut().reset(tokio::time::Instant::now() + SHUTDOWN_GRACE);
            }
            () = &mut grace, if draining => return,
        }
    }
}
