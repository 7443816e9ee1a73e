//! The API listener: hyper's connection builder with the limits `axum::serve` does not
//! offer — at most `max_connections` at once (more wait in the kernel's backlog), a
//! header-read timeout (slowloris; on HTTP/1.1 it also closes a keep-alive connection
//! idle for that long), HTTP/2 keep-alive pings, and a graceful shutdown bounded in time.

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The listener's limits (`serve`'s flags).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time to receive a request's headers, counted from when the connection is ready
    /// for the next request (so also an idle keep-alive connection's lifetime).
    pub header_read_timeout: Duration,
}

/// How long in-flight requests may finish after the shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);

/// Serve `app` on `listener` until `shutdown` resolves, then let open connections finish
/// their requests (at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let graceful = GracefulShutdown::new();
    let mut at_cap_logged = false;
    tokio::pin!(shutdown);
    loop {
        if permits.available_permits() == 0 && !at_cap_logged {
            tracing::warn!(
                max_connections = limits.max_connections,
                "the API listener is at its connection cap; new connections wait"
            );
            at_cap_logged = true;
        }
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        at_cap_logged = false;
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let first_byte = limits.header_read_timeout;
        tokio::spawn(async move {
            // hyper's header-read timer starts once the HTTP version is known, i.e. after
            // the first bytes: a connection that sends nothing at all would be held
            // forever. It gets the same time to send its first byte.
            let mut probe = [0u8; 1];
            match tokio::time::timeout(first_byte, stream.peek(&mut probe)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return drop(permit),
            }
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            // A client that goes away or times out is not an error of ours.
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?DRAIN, "connections still open after the drain; closing them");
    }
}
