//! oncely-producer: the Rust SDK agents use to enqueue actions.
