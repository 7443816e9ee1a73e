//! `oncely-producer`: see `oncely-producer --help`.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

use clap::Parser;

#[tokio::main]
async fn main() {
    oncely_core::telemetry::init();
    let cli = oncely_producer::cli::Cli::parse();
    let code = match oncely_producer::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
