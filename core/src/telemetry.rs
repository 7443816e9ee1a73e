//! Logging setup shared by every binary.
//!
//! JSON lines when stderr is not a terminal (containers, CI, log shippers) or when
//! `ONCELY_LOG_FORMAT=json`; human-readable when it is a terminal or
//! `ONCELY_LOG_FORMAT=pretty`. `RUST_LOG` filters (default `info`). Logs carry keys,
//! action types, workflows and attempts — never payloads or secrets: no code path
//! formats a payload or a [`crate::KeyRing`] into a log line.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Install the global subscriber (once; later calls are no-ops).
pub fn init() {
    init_with_default("info");
}

/// [`init`] with another default level when `RUST_LOG` is unset (the demo uses `warn`).
pub fn init_with_default(level: &str) {
    init_quieting(level, &[]);
}

/// [`init_with_default`], with `targets` held at `warn` unless `RUST_LOG` names them: for
/// libraries whose debug logs may carry message bodies (the MCP SDK logs whole JSON-RPC
/// messages, i.e. tool arguments and payloads, at debug and trace).
pub fn init_quieting(level: &str, targets: &[&str]) {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_owned());
    let mut spec = spec;
    for t in targets {
        if !spec.contains(t) {
            spec.push_str(&format!(",{t}=warn"));
        }
    }
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new(level));
    let json = match std::env::var("ONCELY_LOG_FORMAT").as_deref() {
        Ok("json") => true,
        Ok("pretty") => false,
        _ => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder.try_init()
    };
}
