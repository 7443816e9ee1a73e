//! `oncely-worker`: see `oncely-worker --help`.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

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
