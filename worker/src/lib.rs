//! oncely-worker: the processes that execute and settle operations.
//!
//! # Layout
//! - [`context`]: config, journal, providers and identity shared by a process.
//! - [`provider`]: the provider trait and the generic HTTP/JSON adapter.
//! - [`decide`]: the classification table and the not-claimed decisions (pure).
//! - [`flow`]: the fleet's budget per provider: slots before a call, pushback after.
//! - [`deferred`]: the sweeper's pass over deferred operations (republish when due, give up).
//! - [`runner`]: the action worker (consume → claim → call → commit → ack).
//! - [`broker`]: the broker session shared by the runner and the reconciler.
//! - [`reconcile_request`]: the message on the reconcile queue.
//! - [`reconciler`]: the reconciler and the sweeper.
//! - [`admin`]: `oncely-worker admin` (ops, reviews, purge).
//! - [`outcome`]: outcome events for agents.
//! - [`retry`]: journal calls through database trouble.
//! - [`shutdown`]: the shutdown signal passed into every loop.
//! - [`failpoint`]: crash points for the chaos run (compiled out unless the chaos run's
//!   own build turns on the `failpoints` feature).
//! - [`cli`]: the `oncely-worker` command.

// A panic is a lost delivery slot, a dead commit loop or a dropped request: shipped code
// returns errors (tests may expect; clippy.toml).
#![warn(clippy::expect_used)]

pub mod admin;
pub mod broker;
pub mod cli;
pub mod context;
pub mod decide;
pub mod deferred;
pub mod failpoint;
pub mod flow;
pub mod outcome;
pub mod provider;
pub mod reconcile_request;
pub mod reconciler;
pub mod retry;
pub mod runner;
pub mod shutdown;
pub mod statement;
