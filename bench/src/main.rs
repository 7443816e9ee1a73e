//! `oncely-bench`: oncely against its two ceilings, in one run. See `oncely-bench --help`
//! and `docs/performance.md`.

use clap::Parser;
use oncely_bench::{self as bench, BenchArgs};

#[tokio::main]
async fn main() {
    let args = BenchArgs::parse().with_cluster_first();
    oncely_core::telemetry::init_with_default("warn");
    let (db, amqp) = (args.database_url.clone(), args.amqp_url.clone());
    let outcome = tokio::select! {
        r = bench::run(args) => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: removing the bench's databases, queues and workers");
            bench::cleanup_all(&db, &amqp).await;
            std::process::exit(130);
        }
    };
    if let Err(e) = outcome {
        // Whatever a failed measurement could not remove itself.
        bench::cleanup_all(&db, &amqp).await;
        eprintln!("oncely-bench failed: {e:#}");
        std::process::exit(1);
    }
}
