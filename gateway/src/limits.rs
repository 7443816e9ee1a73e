//! Caps on what one token can hold open: long-polls (`?wait=`, `action_wait`) per token
//! and in total, MCP sessions per token. A tenant that opens thousands of them gets `429`
//! for the excess; everyone else's submits go on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The caps (`serve`'s flags).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Long-polls open at once, per token.
    pub waits_per_token: usize,
    /// Long-polls open at once, in total.
    pub waits: usize,
    /// MCP sessions alive at once, per token.
    pub mcp_sessions_per_token: usize,
    /// The longest long-poll (a longer `wait` is cut to it).
    pub max_wait: Duration,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            waits_per_token: 200,
            waits: 2000,
            mcp_sessions_per_token: 64,
            max_wait: Duration::from_secs(60),
        }
    }
}

/// Counts per token, with a cap per token and one in total.
#[derive(Debug, Default)]
pub struct Gate {
    per_token: Mutex<HashMap<String, usize>>,
    total: AtomicUsize,
    max_per_token: AtomicUsize,
    max_total: AtomicUsize,
    /// Milliseconds; 0 until set (then [`Caps::default`]'s).
    max_wait_ms: AtomicU64,
}

/// Which cap refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The token's own.
    Token(usize),
    /// The gateway's.
    Total(usize),
}

impl Gate {
    /// A gate with these caps.
    pub fn new(max_per_token: usize, max_total: usize) -> Self {
        let g = Self::default();
        g.set(max_per_token, max_total);
        g
    }

    /// Change the caps (at start).
    pub fn set(&self, max_per_token: usize, max_total: usize) {
        self.max_per_token.store(max_per_token, Ordering::Relaxed);
        self.max_total.store(max_total, Ordering::Relaxed);
    }

    /// Change the longest long-poll (at start).
    pub fn set_max_wait(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.max_wait_ms.store(ms, Ordering::Relaxed);
    }

    /// The longest long-poll.
    pub fn max_wait(&self) -> Duration {
        match self.max_wait_ms.load(Ordering::Relaxed) {
            0 => Caps::default().max_wait,
            ms => Duration::from_millis(ms),
        }
    }

    /// One more for `token`, or which cap refused. The slot is given back when the
    /// guard drops.
    pub fn enter<'g>(&'g self, token: &str) -> Result<Slot<'g>, Over> {
        let mut map = self.per_token.lock().unwrap_or_else(|p| p.into_inner());
        let max_total = self.max_total.load(Ordering::Relaxed);
        if self.total.load(Ordering::Relaxed) >= max_total {
            return Err(Over::Total(max_total));
        }
        let max = self.max_per_token.load(Ordering::Relaxed);
        let n = map.entry(token.to_owned()).or_default();
        if *n >= max {
            return Err(Over::Token(max));
        }
        *n += 1;
        let open = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        metrics::gauge!(oncely_core::metrics::GATEWAY_LONG_POLLS_OPEN).set(open as f64);
        Ok(Slot {
            gate: self,
            token: token.to_owned(),
        })
    }

    fn leave(&self, token: &str) {
        let mut map = self.per_token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(token);
            }
        }
        let open = self.total.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        metrics::gauge!(oncely_core::metrics::GATEWAY_LONG_POLLS_OPEN).set(open as f64);
    }

    /// Open now (for a gauge and tests).
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

/// A slot of a [`Gate`], given back on drop.
#[derive(Debug)]
pub struct Slot<'g> {
    gate: &'g Gate,
    token: String,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.gate.leave(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_token_and_in_total_and_slots_come_back() {
        let g = Gate::new(2, 3);
        let a1 = g.enter("a").expect("a1");
        let _a2 = g.enter("a").expect("a2");
        assert_eq!(g.enter("a").err(), Some(Over::Token(2)));
        let _b1 = g.enter("b").expect("b1");
        assert_eq!(g.enter("c").err(), Some(Over::Total(3)));
        drop(a1);
        assert_eq!(g.open(), 2);
        let _c1 = g.enter("c").expect("a slot came back");
    }
}
