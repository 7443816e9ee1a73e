//! oncely-gateway: the agents' front door.
//!
//! Agents enqueue actions over HTTP (`POST /v1/actions/{action_type}`) or as MCP tools,
//! with a bearer token — never the fleet's HMAC secret, never an AMQP client. The gateway
//! derives the key (tenant from the token + business identity), records `planned` in
//! Postgres and publishes through the producer SDK, exactly as a Rust producer would.
//!
//! # Layout
//! - [`service`]: what the gateway does, for both front ends.
//! - [`coalesce`]: concurrent requests recorded and published as one batch.
//! - [`http`]: the HTTP API, `/openapi.json`, the ops listener.
//! - [`mcp`]: the MCP tool server (streamable HTTP at `/mcp`, stdio).
//! - [`tokens`]: bearer tokens, tenants, allowed action types, quotas.
//! - [`quota`]: the quotas per token and per tenant (429 at the front door).
//! - [`client_keys`]: the optional `Idempotency-Key` header.
//! - [`cli`]: the `oncely-gateway` command.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

pub mod cli;
pub mod client_keys;
pub mod coalesce;
pub mod contract;
pub mod desk;
pub mod http;
pub mod limits;
pub mod listener;
pub mod mcp;
pub mod quota;
pub mod service;
pub mod tokens;

pub use service::Service;
