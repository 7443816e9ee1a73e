//! A process without a metrics listener must not keep what it records: before issue 43
//! `install(None)` installed a Prometheus recorder that nothing ever drained (no
//! listener, no `run_upkeep`), so every histogram sample stayed in memory.
//! One test in its own binary: the global recorder is per process, and RSS is read
//! from `/proc/self`.

#![allow(clippy::unwrap_used)]

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn without_a_listener_histogram_samples_are_not_kept() {
    oncely_core::metrics::install(None).unwrap();
    let record = |n: usize| {
        for i in 0..n {
            metrics::histogram!(oncely_core::metrics::CLAIM_BATCH_SIZE).record((i % 64) as f64);
        }
    };
    record(100_000);
    let before = rss_kib();
    record(4_000_000);
    let after = rss_kib();
    println!("RSS {before} KiB → {after} KiB after 4,000,000 samples");
    assert!(
        after < before + 4 * 1024,
        "RSS grew from {before} KiB to {after} KiB: samples are kept"
    );
}
