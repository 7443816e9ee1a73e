//! `oncely-gateway`: see `oncely-gateway --help`.

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
