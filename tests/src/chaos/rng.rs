//! The run's seeded random draws. One seed gives separate streams (workload, schedule,
//! provider faults), so a run's workload and fault schedule can be repeated from the
//! printed seed; the draws are the sandbox's SplitMix64, so no other generator is needed.

use oncely_sandbox::SplitMix64;
use std::time::Duration;

/// A seeded PRNG (SplitMix64, the sandbox's) with the draws the schedule needs.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    /// 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn f64(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.u64() % (hi.saturating_sub(lo) + 1)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.f64()
    }

    /// A duration uniform in `[lo, hi)` seconds.
    pub fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(self.uniform(lo, hi))
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}
