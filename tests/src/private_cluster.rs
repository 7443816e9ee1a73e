//! A private three-node RabbitMQ cluster for one test: three [`PrivateBroker`] nodes
//! (each with its own name, AMQP and distribution ports, and directory; the shared Erlang
//! cookie of `/var/lib/rabbitmq`, see [`crate::private_broker`]), the second and third
//! joined to the first (`rabbitmqctl stop_app`, `join_cluster`, `start_app`).
//!
//! Nodes are started one after the other: each picks free ports only after the previous
//! one has bound its own. Quorum queues declared once the cluster is formed get a member
//! on every node (RabbitMQ's default initial group size is the cluster's size).
//!
//! Faults: [`PrivateCluster::kill`] (SIGKILL, no goodbye), [`PrivateCluster::boot`] (the
//! node comes back on its data and rejoins), and [`PrivateCluster::leader_of`] to find
//! which node leads a quorum queue. Dropping the cluster stops every node and removes
//! their directories.

use crate::eventually;
use crate::private_broker::PrivateBroker;
use std::time::Duration;

/// How long a quorum queue may take to have a leader again after a fault.
const ELECTION_DEADLINE: Duration = Duration::from_secs(120);

/// Three clustered private nodes.
#[derive(Debug)]
pub struct PrivateCluster {
    nodes: Vec<PrivateBroker>,
}

/// A queue as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMembers {
    /// The queue's name.
    pub name: String,
    /// Its type (`quorum`, `classic`).
    pub kind: String,
    /// The node leading it (empty when not known).
    pub leader: String,
    /// Its members (quorum queues), sorted.
    pub members: Vec<String>,
}

impl PrivateCluster {
    /// Start three nodes and join the second and third to the first; returns once
    /// `cluster_status` lists all three as running.
    pub async fn start() -> PrivateCluster {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(PrivateBroker::start().await);
        }
        let first = nodes[0].node().to_owned();
        for node in &nodes[1..] {
            for args in [
                vec!["stop_app"],
                vec!["join_cluster", first.as_str()],
                vec!["start_app"],
            ] {
                let out = node.ctl(&args).await;
                assert!(
                    out.status.success(),
                    "rabbitmqctl {args:?} on {}: {}",
                    node.node(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let cluster = PrivateCluster { nodes };
        cluster.await_running(3).await;
        cluster
    }

    /// The nodes, in the order they were started.
    pub fn nodes(&self) -> &[PrivateBroker] {
        &self.nodes
    }

    /// Every node's AMQP URL (for `broker.urls`).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(PrivateBroker::url).collect()
    }

    /// The node named `name` (`rabbit@…`), panicking if it is not one of ours.
    pub fn node(&self, name: &str) -> &PrivateBroker {
        self.nodes
            .iter()
            .find(|n| n.node() == name)
            .unwrap_or_else(|| panic!("{name} is not a node of this cluster"))
    }

    /// SIGKILL the node `name` and wait until it is gone.
    pub async fn kill(&self, name: &str) {
        self.node(name).kill().await;
    }

    /// Start the node `name` again on its data and wait until it has booted and the
    /// cluster reports `running` nodes.
    pub async fn boot(&self, name: &str, running: usize) {
        self.node(name).boot().await;
        self.await_running(running).await;
    }

    /// Wait until `cluster_status` (asked of any node that answers) lists `n` running
    /// nodes.
    pub async fn await_running(&self, n: usize) {
        eventually(
            &format!("{n} running nodes in the cluster"),
            ELECTION_DEADLINE,
            || async {
                for node in &self.nodes {
                    let out = node.ctl(&["cluster_status", "--formatter", "json"]).await;
                    if !out.status.success() {
                        continue;
                    }
                    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
                    let running = v["running_nodes"].as_array().map_or(0, Vec::len);
                    return (running == n).then_some(());
                }
                None
            },
        )
        .await;
    }

    /// The queues of the default vhost whose name starts with `prefix`, as the first
    /// answering node reports them (`list_queues name type leader members`), sorted by
    /// name; `None` if no node answered.
    pub async fn queues(&self, prefix: &str) -> Option<Vec<QueueMembers>> {
        for node in &self.nodes {
            let out = node
                .ctl(&[
                    "list_queues",
                    "-p",
                    "/",
                    "name",
                    "type",
                    "leader",
                    "members",
                    "--formatter",
                    "json",
                ])
                .await;
            if !out.status.success() {
                continue;
            }
            let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let mut queues: Vec<QueueMembers> = list
                .iter()
                .filter(|q| q["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
                .map(|q| {
                    let mut members: Vec<String> = q["members"]
                        .as_array()
                        .map(|m| m.iter().map(text).collect())
                        .unwrap_or_default();
                    members.sort();
                    QueueMembers {
                        name: text(&q["name"]),
                        kind: text(&q["type"]),
                        leader: text(&q["leader"]),
                        members,
                    }
                })
                .collect();
            queues.sort_by(|a, b| a.name.cmp(&b.name));
            return Some(queues);
        }
        None
    }

    /// The node leading the quorum queue `queue`, once one is known and is a node of
    /// this cluster (waits through an election).
    pub async fn leader_of(&self, queue: &str) -> String {
        eventually(
            &format!("a known leader of {queue}"),
            ELECTION_DEADLINE,
            || async {
                let queues = self.queues(queue).await?;
                let q = queues.into_iter().find(|q| q.name == queue)?;
                self.nodes
                    .iter()
                    .any(|n| n.node() == q.leader)
                    .then_some(q.leader)
            },
        )
        .await
    }

    /// The names of all three nodes, sorted (to compare with a queue's members).
    pub fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.nodes.iter().map(|n| n.node().to_owned()).collect();
        names.sort();
        names
    }
}
