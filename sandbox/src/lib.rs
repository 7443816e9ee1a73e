//! oncely-sandbox: a fake outside world for oncely's tests, demo and benchmarks.
//!
//! Why it exists: oncely's job is to make an agent's side effects (an email,
//! a ticket, a payment order) happen exactly once although workers crash,
//! time out and retry. Proving that needs providers that behave like careful
//! real ones — idempotency keys, replays, 409/422, lookups — and that can be
//! told to fail in the nasty ways real ones do (accept then time out, accept
//! then reset, forget keys…), while counting, as ground truth, how many times
//! each effect really happened. That is this crate: a real HTTP/1.1 and HTTP/2
//! server ([`spawn`]; h2c by prior knowledge, ALPN `h2` on its TLS listener) plus a
//! client for its control API ([`control::Client`]).
//! See `docs/sandbox.md` for every endpoint.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod conn;
pub mod control;
mod effects;
mod faults;
pub mod http;
mod injector;
mod provider;
mod rng;
mod server;
mod state;
mod stats;
mod store;

pub use effects::{EffectCount, Effects, KeyEffects};
pub use faults::{
    DEFAULT_ERROR_STATUS, DEFAULT_HOLD_MS, FaultConfigError, FaultMode, FaultRule, Faults,
    RateLimitFault,
};
pub use provider::Provider;
pub use rng::SplitMix64;
pub use server::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use stats::{FaultCounts, PerProvider, Stats};
pub use store::{RecordStatus, RecordView};

/// A running sandbox server. Dropping it stops the server too (without
/// waiting); [`Sandbox::shutdown`] stops it and waits.
#[derive(Debug)]
pub struct Sandbox {
    addr: SocketAddr,
    state: Arc<state::State>,
    router: axum::Router,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    tls_tasks: Vec<JoinHandle<()>>,
}

/// Binds `listen` (port 0 picks a free port) and serves in a background task.
pub async fn spawn(listen: SocketAddr) -> anyhow::Result<Sandbox> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let state = Arc::new(state::State::new());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let router = server::router(server::App {
        state: state.clone(),
        shutdown: shutdown_rx.clone(),
    });
    let task = tokio::spawn(conn::accept_loop(
        listener,
        router.clone(),
        None,
        shutdown_rx,
    ));
    tracing::info!(%addr, "sandbox listening");
    Ok(Sandbox {
        addr,
        state,
        router,
        shutdown,
        task,
        tls_tasks: Vec::new(),
    })
}

impl Sandbox {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT` of the server.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A control API client for this server.
    pub fn control(&self) -> control::Client {
        control::Client::new(&self.base_url())
    }

    /// Installs a fault config directly (same validation as `PUT /control/faults`).
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultConfigError> {
        self.state.set_faults(faults)
    }

    /// Serves the same endpoints (same records, effects and faults) over TLS on
    /// `listen` too, with `config`'s certificate; returns the bound address. Each new
    /// TLS connection first meets the TLS faults (`tls_drop_rate`, `tls_stall_rate`).
    pub async fn serve_tls(
        &mut self,
        listen: SocketAddr,
        config: Arc<rustls::ServerConfig>,
    ) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        // Offer HTTP/2 as well (ALPN), as real APIs do; a client that asks for neither
        // gets HTTP/1.1.
        let mut config = Arc::unwrap_or_clone(config);
        if config.alpn_protocols.is_empty() {
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        }
        let tls = conn::TlsSide {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            state: self.state.clone(),
        };
        self.tls_tasks.push(tokio::spawn(conn::accept_loop(
            listener,
            self.router.clone(),
            Some(tls),
            self.shutdown.subscribe(),
        )));
        tracing::info!(%addr, "sandbox listening with TLS");
        Ok(addr)
    }

    /// From now on provider requests (not the control API) without `name: value` are
    /// answered `401 {"error":"unauthorized"}` and counted in `unauthorized_401`, as a
    /// provider checking its API key would.
    pub fn require_header(&self, name: &str, value: &str) {
        self.state.require_header(name, value);
    }

    /// The ground-truth effect ledger, read directly.
    pub fn effects(&self) -> Effects {
        self.state.effects()
    }

    /// The counters of what the sandbox saw (`GET /control/stats`), read directly.
    pub fn stats(&self) -> Stats {
        self.state.stats()
    }

    /// How many keys have had an effect: what [`Sandbox::effects`] would hold, without
    /// copying the ledger (a poller's cheap progress check; the copy holds the ledger's
    /// lock, and with it every provider request, for as long as it takes).
    pub fn distinct_effect_keys(&self) -> usize {
        self.state.distinct_effect_keys()
    }

    /// Stops accepting, lets open requests finish (briefly), and waits.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        for task in std::iter::once(self.task).chain(self.tls_tasks) {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "sandbox task ended abnormally");
            }
        }
        tracing::info!(addr = %self.addr, "sandbox stopped");
    }
}
