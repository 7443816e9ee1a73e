//! oncely-core: what every oncely process shares.
//!
//! # Layout
//! - [`amqp`]: connecting to RabbitMQ, plain or TLS.
//! - [`canonical`]: canonical JSON, byte-for-byte the article's Python.
//! - [`identity`]: the business identity and [`ActionType`].
//! - [`keys`]: idempotency keys, payload hashes, the key secret.
//! - [`intent`]: intents and the `oncely.intent.v1` envelope, parsed at the edge.
//! - [`metrics`]: metric names and the exporter.
//! - [`publish`]: publishing with confirms (a returned message is a failure).
//! - [`sealing`]: payloads encrypted at rest (AES-256-GCM data keys).
//! - [`review`]: why operations go to review, which reasons a lookup may still settle
//!   (transient) and which wait for a person (definitive), and a review's evidence.
//! - [`status`]: the status set and the one transition table.
//! - [`config`]: policies and providers (TOML + env overrides).
//! - [`db`]: connecting, creating and migrating the database.
//! - [`journal`]: the operations journal — the only module with SQL.
//! - [`roles`]: least privilege — Postgres group roles and grants, the start-up check,
//!   RabbitMQ permissions.
//! - [`telemetry`]: logging setup.
//! - [`tls`]: certificate files and TLS failures in words (Postgres and RabbitMQ).
//! - [`topology`]: RabbitMQ names and declarations.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

pub mod amqp;
pub mod approval;
pub mod canonical;
pub mod config;
pub mod db;
pub mod identity;
pub mod intent;
pub mod journal;
pub mod keys;
pub mod metrics;
pub mod outcome;
pub mod pooler;
pub mod publish;
pub mod review;
pub mod roles;
pub mod schema;
pub mod sealing;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod topology;

pub use identity::{ActionType, BusinessIdentity};
pub use intent::{Envelope, Intent};
pub use keys::{IdempotencyKey, KeyRing, PayloadHash};
pub use pooler::Db;
pub use sealing::DataKeys;
pub use status::Status;
