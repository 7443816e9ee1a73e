//! A fleet on a private three-node RabbitMQ cluster (`broker.urls`): the queues are
//! quorum queues with a member on every node, and the node leading the action queue is
//! SIGKILLed mid-run, restarted, then another node is SIGKILLed and restarted. Every
//! intent still runs exactly once: all operations `succeeded`, one sandbox effect per
//! key, no process exited.

use crate::resilience::{
    DEADLINE, assert_alive, assert_exactly_once, connect_producer, count, enqueue, intent,
    sessions, wait_succeeded_at_least,
};
use oncely_core::Intent;
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions};
use oncely_tests::private_cluster::PrivateCluster;
use serde_json::json;

/// Intents in all, in four waves.
const N: usize = 1600;
const WAVE: usize = N / 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_action_queues_leader_is_killed_then_another_node_and_every_intent_runs_once() {
    let cluster = PrivateCluster::start().await;
    let fleet = Fleet::with(FleetOptions {
        amqp_urls: cluster.urls(),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let topology = fleet.topology();

    // The fleet declared its queues on the formed cluster: all quorum queues with a
    // member on each of the three nodes.
    let queues = cluster
        .queues(&format!("{}.", fleet.prefix))
        .await
        .expect("a node answers list_queues");
    let mut expected: Vec<String> = fleet
        .config
        .actions
        .keys()
        .map(|t| topology.action_queue(t))
        .chain([topology.reconcile_queue(), topology.dead_queue()])
        .collect();
    expected.sort();
    let names: Vec<&str> = queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, expected, "the fleet's queues");
    for q in &queues {
        assert_eq!(q.kind, "quorum", "{q:?}");
        assert_eq!(q.members, cluster.node_names(), "{} on every node", q.name);
    }

    // Slow the provider so that each fault lands while a wave is in flight.
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"latency_ms": 100}))
        .await
        .expect("faults");
    let mut procs = vec![fleet.worker(), fleet.worker(), fleet.reconciler()];
    let mut waves: Vec<Vec<Intent>> = Vec::new();
    let mut intents: Vec<Intent> = (0..N).map(intent).collect();
    for _ in 0..3 {
        let rest = intents.split_off(WAVE);
        waves.push(std::mem::replace(&mut intents, rest));
    }
    waves.push(intents);
    let mut waves = waves.into_iter();
    let mut next_wave = || waves.next().expect("four waves");
    let action_queue = topology.action_queue("email.send");

    // Fault 1: SIGKILL the node leading the action queue while the first wave runs.
    let first = cluster.leader_of(&action_queue).await;
    let producer = connect_producer(&fleet).await;
    enqueue(&producer, next_wave()).await;
    wait_succeeded_at_least(&fleet, 50, "the first wave to be under way").await;
    cluster.kill(&first).await;
    let at = count(&fleet.db.pool, "succeeded").await.unwrap_or(0);
    eprintln!("fault 1: SIGKILL {first} (leader of {action_queue}) at {at} of {WAVE} succeeded");
    assert!(
        at < WAVE as i64,
        "the fault landed mid-wave ({at} of {WAVE} done)"
    );
    drop(producer);
    // Two nodes of three are a majority: the queue gets a new leader and work goes on;
    // a new producer finds a live node.
    let second = cluster.leader_of(&action_queue).await;
    assert_ne!(
        second, first,
        "a new leader was elected among the survivors"
    );
    let producer = connect_producer(&fleet).await;
    enqueue(&producer, next_wave()).await;
    wait_succeeded_at_least(
        &fleet,
        WAVE as i64 + 50,
        "the second wave to run on two nodes",
    )
    .await;
    cluster.boot(&first, 3).await;

    // Fault 2: SIGKILL the queue's leader now (another node than the first) while the
    // third wave runs.
    let leader = cluster.leader_of(&action_queue).await;
    let victim = if leader != first { leader } else { second };
    enqueue(&producer, next_wave()).await;
    wait_succeeded_at_least(
        &fleet,
        2 * WAVE as i64 + 50,
        "the third wave to be under way",
    )
    .await;
    cluster.kill(&victim).await;
    let at = count(&fleet.db.pool, "succeeded").await.unwrap_or(0);
    eprintln!(
        "fault 2: SIGKILL {victim} at {at} of {} succeeded",
        3 * WAVE
    );
    assert!(
        at < 3 * WAVE as i64,
        "the fault landed mid-wave ({at} of {} done)",
        3 * WAVE
    );
    drop(producer);
    let producer = connect_producer(&fleet).await;
    enqueue(&producer, next_wave()).await;
    drop(producer);
    wait_succeeded_at_least(
        &fleet,
        3 * WAVE as i64 + 50,
        "the fourth wave to run on two nodes",
    )
    .await;
    cluster.boot(&victim, 3).await;

    assert_exactly_once(&fleet, N).await;
    // The queues are whole again: a member on every node, a leader among them.
    eventually(
        "every queue with three members and a leader",
        DEADLINE,
        || async {
            let queues = cluster.queues(&format!("{}.", fleet.prefix)).await?;
            queues
                .iter()
                .all(|q| {
                    q.members == cluster.node_names() && cluster.node_names().contains(&q.leader)
                })
                .then_some(())
        },
    )
    .await;
    // For the record: which processes lost their node and came back on another.
    for p in &procs {
        let log = p.logs();
        eprintln!(
            "{}: {} sessions, {} failovers to another node",
            p.log.display(),
            sessions(&log),
            log.matches("connected to another RabbitMQ node").count()
        );
    }
    assert_alive(&mut procs);
    drop(procs);
    drop(fleet);
    drop(cluster);
}
