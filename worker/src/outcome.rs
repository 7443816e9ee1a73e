//! Outcome events for agents: the shared definition lives in [`oncely_core::outcome`]
//! (the gateway publishes them too, for cancels and approvals).

pub use oncely_core::outcome::*;
