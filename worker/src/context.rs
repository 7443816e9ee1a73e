//! What every worker-side process holds: config, journal, providers, names, identity.

use crate::provider::{self, Provider};
use oncely_core::amqp::AmqpConnector;
use oncely_core::config::{ActionPolicy, Config};
use oncely_core::journal::Journal;
use oncely_core::topology::Topology;
use oncely_core::{ActionType, KeyRing};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Shared, read-only state of a worker or reconciler process.
#[derive(Debug, Clone)]
pub struct Context {
    /// The loaded config.
    pub config: Arc<Config>,
    /// The journal.
    pub journal: Journal,
    /// Providers by name.
    pub providers: Arc<BTreeMap<String, Arc<dyn Provider>>>,
    /// The key secret, when this process holds it (then keys are verified).
    pub secret: Option<KeyRing>,
    /// Broker names.
    pub topology: Topology,
    /// This process's identity: the lease owner and the event actor.
    pub owner: String,
    /// The payload schemas of the configured action types.
    pub schemas: Arc<oncely_core::schema::PayloadSchemas>,
    /// Flow control: the fleet's budget per provider.
    pub flow: Arc<crate::flow::Flow>,
    /// The approval rules: a delivery published without the SDK is held by the worker
    /// before its claim when a rule matches (docs/approvals.md).
    pub approvals: Arc<oncely_core::approval::Approvals>,
    /// Keys this process has claimed and not yet committed (its calls in flight, in any
    /// session): a claim that meets a live lease of this process on a key *not* here holds
    /// a lease from a claim whose answer was lost, and may take it up (see
    /// `runner::claim`). Process-wide, so a session started while an older one's calls
    /// still drain cannot take up their leases.
    pub in_flight: Arc<std::sync::Mutex<std::collections::HashSet<oncely_core::IdempotencyKey>>>,
    /// The broker's URL with its TLS files read (at start: a bad file stops the process
    /// there, with the field and the file named).
    pub amqp: AmqpConnector,
}

impl Context {
    /// Build from a config and a connected journal.
    pub fn new(
        config: Config,
        journal: Journal,
        secret: Option<KeyRing>,
        role: &str,
    ) -> anyhow::Result<Self> {
        let providers = provider::build_used(&config)?;
        let topology = Topology::new(&config.broker);
        let schemas = oncely_core::schema::PayloadSchemas::from_config(&config)
            .map_err(anyhow::Error::msg)?;
        let amqp = AmqpConnector::new(&config.broker)?;
        let approvals =
            oncely_core::approval::Approvals::from_config(&config).map_err(anyhow::Error::msg)?;
        Ok(Self {
            approvals: Arc::new(approvals),
            flow: Arc::new(crate::flow::Flow::new(&config)),
            amqp,
            schemas: Arc::new(schemas),
            config: Arc::new(config),
            journal,
            providers: Arc::new(providers),
            secret,
            topology,
            owner: process_id(role),
            in_flight: Arc::default(),
        })
    }

    /// The policy and provider for an action type, if this fleet knows it.
    pub fn route(&self, action: &ActionType) -> Option<(&ActionPolicy, &Arc<dyn Provider>)> {
        let policy = self.config.policy(action)?;
        let provider = self.providers.get(&policy.provider)?;
        Some((policy, provider))
    }

    /// The configured action types.
    pub fn action_types(&self) -> Vec<&str> {
        self.config.actions.keys().map(String::as_str).collect()
    }
}

/// `role@host:pid:nonce` — unique per process start, readable in the audit trail.
pub fn process_id(role: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or(0);
    format!("{role}@{host}:{}:{nonce:x}", std::process::id())
}
