//! Counters of what the sandbox saw, for benchmarks and test diagnostics.
//!
//! Why: effects say whether duplicates happened; stats say how hard the
//! clients had to work for it (retries answered by replay, 409s, lookups,
//! faults injected), which is what a benchmark report compares.

use serde::{Deserialize, Serialize};

use crate::faults::FaultMode;
use crate::provider::Provider;

/// One counter per provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PerProvider {
    /// Mail.
    pub mail: u64,
    /// Tickets.
    pub tickets: u64,
    /// Bank.
    pub bank: u64,
}

impl PerProvider {
    fn bump(&mut self, provider: Provider) {
        match provider {
            Provider::Mail => self.mail += 1,
            Provider::Tickets => self.tickets += 1,
            Provider::Bank => self.bank += 1,
        }
    }
}

/// How many times each fault was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FaultCounts {
    /// `accept_then_timeout` rules applied.
    pub accept_then_timeout: u64,
    /// `accept_then_reset` rules applied.
    pub accept_then_reset: u64,
    /// `error_before_commit` rules applied.
    pub error_before_commit: u64,
    /// `reject` rules applied.
    pub reject: u64,
    /// `latency` rules applied.
    pub latency: u64,
    /// Lookups refused because lookup is disabled for the provider.
    pub lookup_disabled: u64,
    /// TLS connections closed before the handshake (`tls_drop_rate`).
    #[serde(default)]
    pub tls_dropped: u64,
    /// TLS connections held unanswered (`tls_stall_rate`).
    #[serde(default)]
    pub tls_stalled: u64,
}

/// Body of `GET /control/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Execute requests (valid key and body) per provider, whatever their outcome.
    pub executes: PerProvider,
    /// Lookup requests, all providers.
    pub lookups: u64,
    /// Execute requests answered with a saved response.
    pub replays: u64,
    /// Execute requests refused because the key was used with another body.
    pub conflicts_422: u64,
    /// Execute requests refused because the key was in flight.
    pub in_flight_409: u64,
    /// Provider requests refused 401 for lacking the required header.
    #[serde(default)]
    pub unauthorized_401: u64,
    /// Requests (executes and lookups) answered 429 by a `rate_limits` fault.
    #[serde(default)]
    pub rate_limited_429: u64,
    /// Faults injected, by mode.
    pub faults: FaultCounts,
}

impl Stats {
    pub(crate) fn execute(&mut self, provider: Provider) {
        self.executes.bump(provider);
    }

    pub(crate) fn fault(&mut self, mode: FaultMode) {
        let c = &mut self.faults;
        match mode {
            FaultMode::AcceptThenTimeout => c.accept_then_timeout += 1,
            FaultMode::AcceptThenReset => c.accept_then_reset += 1,
            FaultMode::ErrorBeforeCommit => c.error_before_commit += 1,
            FaultMode::Reject => c.reject += 1,
            FaultMode::Latency => c.latency += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let mut s = Stats::default();
        s.execute(Provider::Bank);
        s.fault(FaultMode::Reject);
        let v = serde_json::to_value(s).unwrap();
        assert_eq!(
            v["executes"],
            serde_json::json!({"mail": 0, "tickets": 0, "bank": 1})
        );
        assert_eq!(v["faults"]["reject"], 1);
        for field in ["lookups", "replays", "conflicts_422", "in_flight_409"] {
            assert_eq!(v[field], 0, "{field}");
        }
    }
}
