//! The `oncely-sandbox` binary: the sandbox as a standalone process.
//!
//! Why: the demo and benchmarks run the fake providers as their own process,
//! and tests start it with `--listen 127.0.0.1:0` and read the one stdout
//! line to learn the address. Everything else lives in the library.

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;

use clap::Parser;
use oncely_sandbox::Faults;

/// Fake mail / ticketing / bank providers with idempotency keys, lookups and fault injection.
///
/// Provider endpoints: POST /v1/{emails,tickets,payment-orders} (header Idempotency-Key, JSON
/// body); GET /v1/<resource>?idempotency_key=K | ?reference=R.
/// Control: GET|PUT /control/faults, GET /control/effects[?key=K], GET /control/stats,
/// POST /control/reset, GET /healthz. See docs/sandbox.md.
#[derive(Debug, Parser)]
#[command(name = "oncely-sandbox", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "ONCELY_SANDBOX_LISTEN", default_value = "127.0.0.1:8085")]
    listen: SocketAddr,
    /// Seed of the fault generator (a later PUT /control/faults replaces it).
    #[arg(long, env = "ONCELY_SANDBOX_SEED", default_value_t = 0)]
    seed: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let sandbox = oncely_sandbox::spawn(args.listen).await?;
    sandbox.set_faults(Faults {
        seed: args.seed,
        ..Faults::default()
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "oncely-sandbox listening on {}", sandbox.base_url())?;
    out.flush()?;
    drop(out);
    stop_signal().await?;
    tracing::info!("stopping");
    sandbox.shutdown().await;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn stop_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    Ok(())
}
