//! `oncely-cluster`: a private three-node RabbitMQ cluster on this machine, for the bench
//! and for trying a fleet on a cluster by hand (`tests/src/private_cluster.rs`). Prints
//! the nodes' URLs as `ONCELY_AMQP_URLS=…` (the form `oncely-worker` and `oncely-bench`
//! read), keeps the cluster up until Ctrl-C (or SIGTERM), then stops the nodes and removes
//! their directories.
//!
//! ```sh
//! cargo run -p oncely-tests --bin oncely-cluster            # prints ONCELY_AMQP_URLS=…
//! ONCELY_AMQP_URLS=… ./target/release/oncely-bench         # in another shell
//! ```

use oncely_tests::private_cluster::PrivateCluster;
use std::process::ExitCode;

const USAGE: &str = "\
oncely-cluster: start a private three-node RabbitMQ cluster (distinct node names, ports
and directories; the machine's Erlang cookie), print its URLs, keep it up until Ctrl-C.

USAGE: oncely-cluster [--env-file PATH]

  --env-file PATH   also write `ONCELY_AMQP_URLS=…` to PATH once the cluster is up (for
                    scripts: wait for the file, then source it)

Needs Debian's rabbitmq-server, run as root: its wrappers switch to the rabbitmq user, so
every node and rabbitmqctl share /var/lib/rabbitmq/.erlang.cookie (tests/src/private_broker.rs).";

fn main() -> ExitCode {
    let mut env_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--env-file" => match args.next() {
                Some(p) => env_file = Some(std::path::PathBuf::from(p)),
                None => {
                    eprintln!("oncely-cluster: --env-file needs a path\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("oncely-cluster: unknown argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oncely-cluster: tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        eprintln!("oncely-cluster: starting three nodes and joining them");
        let cluster = PrivateCluster::start().await;
        let line = format!("ONCELY_AMQP_URLS={}", cluster.urls().join(","));
        for node in cluster.nodes() {
            eprintln!("oncely-cluster: {} on {}", node.node(), node.url());
        }
        println!("{line}");
        if let Some(path) = &env_file
            && let Err(e) = std::fs::write(path, format!("{line}\n"))
        {
            eprintln!("oncely-cluster: {}: {e}", path.display());
            return ExitCode::from(2);
        }
        eprintln!("oncely-cluster: up; Ctrl-C stops it");
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("oncely-cluster: SIGTERM handler: {e}");
                    return ExitCode::from(2);
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("oncely-cluster: stopping the nodes");
        drop(cluster);
        ExitCode::SUCCESS
    })
}
