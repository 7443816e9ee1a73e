//! One integration-test binary (one link, shared helpers): real Postgres, real RabbitMQ,
//! real processes. Each test makes its own database and queue prefix.

mod admin;
mod api_contract;
mod approvals_desk;
mod cli;
mod cluster;
mod control;
mod dashboards;
mod desk;
mod failover;
mod flow;
mod gateway;
mod hardening;
mod http2;
mod https;
mod journal;
mod logs;
mod mcp;
mod pipeline;
mod pooler;
mod publish;
mod python_client;
mod quorum_541;
mod reconcile;
mod resilience;
mod roles;
mod runner;
mod security;
mod smtp;
mod statement;
mod stripe;
mod tls_backends;
