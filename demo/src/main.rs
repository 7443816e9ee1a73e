//! `oncely-demo`: see `oncely-demo --help` and the README's "Run".

use clap::Parser;

#[tokio::main]
async fn main() {
    let args = oncely_demo::DemoArgs::parse();
    // Quiet: the table is the output; warnings (retries) go to stderr; sqlx's slow-statement
    // warnings and lapin's channel-closing noise at shutdown are left out.
    oncely_core::telemetry::init_with_default("warn,sqlx=error,lapin=off");
    if let Err(e) = oncely_demo::run(args).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
