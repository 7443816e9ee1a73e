//! Deciding, request by request, which fault (if any) applies.
//!
//! Why separate from the config: the config is what the user asked for; this
//! is the live state that makes the decisions reproducible — the seeded
//! generator and how many times each `times`-limited rule has fired. Both are
//! rebuilt from scratch whenever a config is installed, so a given seed and a
//! given request order always give the same decisions.

use std::time::Duration;

use crate::faults::{FaultRule, Faults};
use crate::provider::Provider;
use crate::rng::SplitMix64;

/// The live fault state: config, generator, per-rule use counts.
#[derive(Debug)]
pub(crate) struct Injector {
    faults: Faults,
    rng: SplitMix64,
    /// A generator of its own for handshakes, so that turning TLS faults on does not
    /// change which requests the rules pick for a given seed.
    tls_rng: SplitMix64,
    used: Vec<u64>,
}

/// What happens to one connection on the TLS listener before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsFault {
    /// Closed before the server's first handshake byte.
    Drop,
    /// Held open, unanswered.
    Stall,
}

/// What was decided for one execute request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// Total delay before the outcome (base latency + the applying rule's).
    pub delay: Duration,
    /// The rule that applies, if any.
    pub rule: Option<FaultRule>,
}

impl Injector {
    pub fn new(faults: Faults) -> Self {
        Injector {
            rng: SplitMix64::new(faults.seed),
            tls_rng: SplitMix64::new(faults.seed ^ 0x7715_7715_7715_7715),
            used: vec![0; faults.rules.len()],
            faults,
        }
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn lookup_disabled(&self, provider: Provider) -> bool {
        self.faults.lookup_disabled.contains(&provider)
    }

    /// One draw per TLS connection (none when no TLS fault is configured).
    pub fn tls_fault(&mut self) -> Option<TlsFault> {
        let (drop, stall) = (self.faults.tls_drop_rate, self.faults.tls_stall_rate);
        if drop + stall <= 0.0 {
            return None;
        }
        let draw = self.tls_rng.next_f64();
        if draw < drop {
            Some(TlsFault::Drop)
        } else if draw < drop + stall {
            Some(TlsFault::Stall)
        } else {
            None
        }
    }

    pub fn forget_after(&self) -> Option<Duration> {
        self.faults.forget_keys_after_ms.map(Duration::from_millis)
    }

    /// Checks the rules in order. Each rule that matches the provider and key
    /// and is not exhausted costs exactly one draw; the first whose draw is
    /// below its rate applies (and uses up one of its `times`).
    pub fn decide(&mut self, provider: Provider, key: &str) -> Decision {
        let mut delay = Duration::from_millis(self.faults.latency_ms);
        for (i, rule) in self.faults.rules.iter().enumerate() {
            if !rule.matches(provider, key) || rule.times.is_some_and(|t| self.used[i] >= t) {
                continue;
            }
            if self.rng.next_f64() < rule.rate {
                self.used[i] += 1;
                delay += Duration::from_millis(rule.latency_ms);
                return Decision {
                    delay,
                    rule: Some(rule.clone()),
                };
            }
        }
        Decision { delay, rule: None }
    }
}

#[cfg(test)]
impl Decision {
    pub fn mode(&self) -> Option<crate::faults::FaultMode> {
        self.rule.as_ref().map(|r| r.mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FaultMode;

    fn modes(inj: &mut Injector, n: usize) -> Vec<Option<FaultMode>> {
        (0..n)
            .map(|i| inj.decide(Provider::Bank, &format!("k{i}")).mode())
            .collect()
    }

    #[test]
    fn same_seed_same_decisions() {
        let faults = Faults {
            seed: 9,
            rules: vec![FaultRule::new(FaultMode::Reject).rate(0.5)],
            ..Faults::default()
        };
        let a = modes(&mut Injector::new(faults.clone()), 64);
        let b = modes(&mut Injector::new(faults), 64);
        assert_eq!(a, b);
        assert!(a.contains(&None) && a.contains(&Some(FaultMode::Reject)));
    }

    #[test]
    fn filters_times_and_order() {
        let mut inj = Injector::new(Faults {
            latency_ms: 5,
            rules: vec![
                FaultRule::new(FaultMode::Reject).key("only").times(1),
                FaultRule::new(FaultMode::Latency)
                    .provider(Provider::Mail)
                    .latency_ms(7),
            ],
            ..Faults::default()
        });
        assert_eq!(inj.decide(Provider::Bank, "x").rule, None);
        assert_eq!(
            inj.decide(Provider::Bank, "x").delay,
            Duration::from_millis(5)
        );
        assert_eq!(
            inj.decide(Provider::Bank, "only").mode(),
            Some(FaultMode::Reject)
        );
        assert_eq!(inj.decide(Provider::Bank, "only").mode(), None);
        let d = inj.decide(Provider::Mail, "only");
        assert_eq!(d.mode(), Some(FaultMode::Latency));
        assert_eq!(d.delay, Duration::from_millis(12));
    }

    #[test]
    fn rate_zero_never_and_rate_one_always() {
        let mut inj = Injector::new(Faults {
            rules: vec![
                FaultRule::new(FaultMode::Reject).rate(0.0),
                FaultRule::new(FaultMode::Latency).rate(1.0),
            ],
            ..Faults::default()
        });
        for m in modes(&mut inj, 100) {
            assert_eq!(m, Some(FaultMode::Latency));
        }
    }
}
