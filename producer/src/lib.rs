//! oncely-producer: the Rust SDK agents use to enqueue actions.
//!
//! [`Producer::enqueue`] computes the key and payload hash, records the intent in the
//! journal (`planned`) *before* publishing, and publishes the envelope persistent and
//! mandatory with publisher confirms. If the publish fails after the row exists, nothing
//! is lost: the sweeper republishes `planned` rows nobody claimed. A duplicate intent
//! reports the existing operation (with its saved result when terminal) and publishes
//! nothing new unless the operation is still `planned`; a conflicting one (same key,
//! other payload) is an error value, never a retry.
//!
//! # Layout
//! - [`producer`]: the SDK.
//! - [`cli`]: the `oncely-producer` command.
//! - [`watch`]: waiting for outcomes, woken by the outcomes exchange.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

pub mod cli;
pub mod producer;
pub mod watch;

pub use producer::{Asked, Enqueued, Producer, ProducerError};
pub use watch::OutcomeWatcher;
