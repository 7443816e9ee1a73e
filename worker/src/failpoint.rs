//! Fail points for the chaos run: crash the process at the worst moments on purpose.
//!
//! With the `failpoints` feature (only the chaos run's own build turns it on) and
//! `ONCELY_FAILPOINTS=after_claim=0.05,after_provider=0.02,after_commit=0.02`, the process
//! aborts at that point with that probability — as abruptly as SIGKILL: no flush, no
//! nack, no commit. `ONCELY_FAILPOINT_SEED` makes the draws repeatable. Without the
//! feature, or without the variable, [`hit`] does nothing.
//!
//! Points: `after_claim` (leases taken, nobody called), `after_provider` (the provider
//! answered, nothing committed), `after_commit` (committed, not acked). Two do not
//! crash: `claim_reply_lost` and `complete_reply_lost` treat a committed statement's
//! answer as lost, so it is retried and meets this worker's own work.

#[cfg(feature = "failpoints")]
mod imp {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn config() -> &'static HashMap<String, f64> {
        static C: OnceLock<HashMap<String, f64>> = OnceLock::new();
        C.get_or_init(|| {
            std::env::var("ONCELY_FAILPOINTS")
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .map(|p| (k.trim().to_owned(), p))
                })
                .collect()
        })
    }

    fn next() -> f64 {
        static STATE: AtomicU64 = AtomicU64::new(0);
        let seed = std::env::var("ONCELY_FAILPOINT_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let _ = STATE.compare_exchange(
            0,
            seed ^ (u64::from(std::process::id()) << 20) | 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        // SplitMix64 step.
        let mut z = STATE
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn fires(name: &str) -> bool {
        config().get(name).is_some_and(|p| next() < *p)
    }

    pub fn hit(name: &str) {
        if fires(name) {
            eprintln!(
                "{{\"level\":\"ERROR\",\"message\":\"failpoint hit: aborting\",\"failpoint\":\"{name}\"}}"
            );
            std::process::abort();
        }
    }
}

/// Maybe crash here (see the module docs).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    imp::hit(name);
}

/// Fail points are compiled out of this build.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Whether a non-crashing fail point fires here (the caller simulates the fault, e.g.
/// `claim_reply_lost`: the claim committed, its answer is treated as lost).
#[cfg(feature = "failpoints")]
pub fn fires(name: &str) -> bool {
    imp::fires(name)
}

/// Fail points are compiled out of this build.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fires(_name: &str) -> bool {
    false
}
