//! `oncely-gateway`: see `oncely-gateway --help`.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = oncely_gateway::cli::Cli::parse();
    let code = match oncely_gateway::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
