//! `oncely-worker`: see `oncely-worker --help`.

use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = oncely_worker::cli::Cli::parse();
    oncely_core::telemetry::init_with_default("info");
    if let Err(e) = oncely_worker::cli::run(cli).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
