//! Whole servers lost mid-run: `--cluster` SIGKILLs the RabbitMQ node that leads the
//! action queue, brings it back, then does the same to another node; `--failover` crashes
//! the Postgres primary (`pg_ctl stop -m immediate`) and promotes its synchronous standby.
//!
//! Both run as one background task beside the fault phase's other faults, at fixed
//! fractions of the phase (so that each lands while intents are still being produced and
//! worked), and write what they did to the [`Timeline`]. The run waits for the task before
//! healing: every node is back and the promoted standby is the primary by then.

use super::schedule::Timeline;
use crate::private_cluster::PrivateCluster;
use crate::private_pg::PrivatePg;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How long a killed node stays down before it is started again.
const NODE_DOWN: Duration = Duration::from_secs(8);
/// How long the run waits for the outages to be over once the fault phase has ended.
const FINISH_DEADLINE: Duration = Duration::from_secs(240);

/// The servers whose loss the run plays out.
#[derive(Debug, Default)]
pub(super) struct Servers {
    /// The three-node RabbitMQ cluster (`--cluster`), and the queue whose leader dies first.
    pub cluster: Option<(Arc<PrivateCluster>, String)>,
    /// The Postgres primary and its synchronous standby (`--failover`).
    pub postgres: Option<Arc<(PrivatePg, PrivatePg)>>,
}

/// What the outages did (printed in the report).
#[derive(Debug, Default, Clone)]
pub(super) struct OutageTally {
    /// One line per node killed: which, why it was chosen, how long it was away.
    pub nodes: Vec<String>,
    /// The failover, when there was one.
    pub failover: Option<String>,
}

/// The outages of a run, under way.
#[derive(Debug)]
pub(super) struct Outages {
    task: Option<JoinHandle<OutageTally>>,
}

impl Outages {
    /// Start the outages of `servers` (none: nothing happens) over a fault phase of
    /// `phase`: the first node at 20 % of it, the failover at 45 %, the second node at 60 %.
    pub fn start(servers: Servers, phase: Duration, timeline: Timeline) -> Outages {
        if servers.cluster.is_none() && servers.postgres.is_none() {
            return Outages { task: None };
        }
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let at = |f: f64| tokio::time::sleep_until((t0 + phase.mul_f64(f)).into());
            let mut tally = OutageTally::default();
            let mut first = None;
            if let Some((cluster, queue)) = &servers.cluster {
                at(0.20).await;
                let leader = cluster.leader_of(queue).await;
                let line =
                    node_outage(cluster, &leader, &format!("leader of {queue}"), &timeline).await;
                tally.nodes.push(line);
                first = Some(leader);
            }
            if let Some(pair) = &servers.postgres {
                at(0.45).await;
                let (primary, standby) = &**pair;
                let started = Instant::now();
                timeline.note(format_args!(
                    "Postgres: primary on :{} crashed (pg_ctl stop -m immediate)",
                    primary.port()
                ));
                primary.kill().await;
                standby.promote().await;
                let took = started.elapsed();
                timeline.note(format_args!(
                    "Postgres: standby on :{} promoted, {:.1} s after the crash",
                    standby.port(),
                    took.as_secs_f64()
                ));
                tally.failover = Some(format!(
                    "primary :{} crashed, standby :{} promoted in {:.1} s",
                    primary.port(),
                    standby.port(),
                    took.as_secs_f64()
                ));
            }
            if let (Some((cluster, queue)), Some(first)) = (&servers.cluster, first) {
                at(0.60).await;
                // Another node than the first: the queue's leader now if that is another
                // one, else the next node in the cluster's order.
                let leader = cluster.leader_of(queue).await;
                let (victim, why) = if leader != first {
                    (leader, format!("leader of {queue}"))
                } else {
                    let other = cluster
                        .nodes()
                        .iter()
                        .map(|n| n.node().to_owned())
                        .find(|n| *n != first)
                        .unwrap_or_else(|| panic!("a cluster of one node"));
                    (
                        other,
                        "a follower (the leader was the first victim)".to_owned(),
                    )
                };
                let line = node_outage(cluster, &victim, &why, &timeline).await;
                tally.nodes.push(line);
            }
            tally
        });
        Outages { task: Some(task) }
    }

    /// Wait until the outages are over (every node back, the standby promoted).
    pub async fn finish(mut self) -> anyhow::Result<OutageTally> {
        let Some(task) = self.task.take() else {
            return Ok(OutageTally::default());
        };
        match tokio::time::timeout(FINISH_DEADLINE, task).await {
            Ok(Ok(tally)) => Ok(tally),
            Ok(Err(e)) => anyhow::bail!("the server outages failed: {e}"),
            Err(_) => anyhow::bail!("the server outages did not end within {FINISH_DEADLINE:?}"),
        }
    }
}

impl Drop for Outages {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// SIGKILL `node`, leave it down for [`NODE_DOWN`], start it again and wait until the
/// cluster has three running nodes; the report's line.
async fn node_outage(
    cluster: &PrivateCluster,
    node: &str,
    why: &str,
    timeline: &Timeline,
) -> String {
    let started = Instant::now();
    timeline.note(format_args!("RabbitMQ: SIGKILL {node} ({why})"));
    cluster.kill(node).await;
    tokio::time::sleep(NODE_DOWN).await;
    timeline.note(format_args!("RabbitMQ: starting {node} again"));
    cluster.boot(node, 3).await;
    let away = started.elapsed();
    timeline.note(format_args!(
        "RabbitMQ: {node} back in the cluster after {:.1} s",
        away.as_secs_f64()
    ));
    format!("{node} ({why}), away {:.1} s", away.as_secs_f64())
}
