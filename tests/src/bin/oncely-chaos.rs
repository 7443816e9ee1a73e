//! `oncely-chaos`: the chaos run — real producer, workers, reconcilers and sandbox under a
//! seeded fault schedule, healed, then checked against the sandbox's ground truth.
//! See `docs/chaos.md` and `oncely-chaos --help`.

use oncely_tests::chaos::{self, Options, USAGE};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Options::from_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("oncely-chaos: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oncely-chaos: tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(chaos::run(opts));
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match outcome {
        Ok(o) if o.passed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("oncely-chaos: the run could not be carried out: {e:#}");
            ExitCode::from(2)
        }
    }
}
