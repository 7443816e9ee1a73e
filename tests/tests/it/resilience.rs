//! Resilience under infrastructure faults, with real processes: the broker drops every
//! connection and restarts (a private RabbitMQ node), Postgres terminates the fleet's
//! backends, a worker gets SIGTERM mid-run. In every case: all operations end
//! `succeeded`, the sandbox saw exactly one effect per key, and the long-running
//! processes survived (or, for SIGTERM, exited cleanly).

use oncely_core::Intent;
use oncely_core::config::ReconcilerConfig;
use oncely_producer::{Enqueued, Producer, ProducerError};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, Proc, secret};
use oncely_tests::private_broker::PrivateBroker;
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;

/// Liveness deadline for a whole run to settle (not a speed target).
pub(crate) const DEADLINE: Duration = Duration::from_secs(240);
const ACTIONS: [&str; 3] = ["email.send", "ticket.create", "payment_order.create"];

pub(crate) fn intent(n: usize) -> Intent {
    let action = ACTIONS[n % 3];
    let payload = match action {
        "email.send" => {
            json!({"to": format!("user-{n}@example.test"), "subject": "Your application", "body": "Approved."})
        }
        "ticket.create" => {
            json!({"title": format!("Review application {n}"), "queue": "ops", "business_reference": format!("app-{n}")})
        }
        _ => {
            json!({"account_id": "example-account", "amount_minor": 1000 + n, "currency": "RUB", "business_reference": format!("application-{n}")})
        }
    };
    Intent::from_json(json!({
        "action_type": action, "workflow_id": format!("case-{}", n / 10), "step": "step",
        "business_object": format!("obj-{n}"), "revision": 1, "payload": payload
    }))
    .expect("intent")
}

/// Count of operations in a status, `None` while the query fails (our own pooled
/// connections may have just been terminated).
pub(crate) async fn count(pool: &PgPool, status: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM agent_operations WHERE status = $1")
        .bind(status)
        .fetch_one(pool)
        .await
        .ok()
}

pub(crate) async fn wait_succeeded_at_least(fleet: &Fleet, n: i64, what: &str) {
    eventually(what, DEADLINE, || async {
        count(&fleet.db.pool, "succeeded")
            .await
            .filter(|c| *c >= n)
            .map(drop)
    })
    .await;
}

/// A producer, connecting again until the broker takes connections (after a fault the
/// SDK's connection is gone and it has no reconnect of its own).
pub(crate) async fn connect_producer(fleet: &Fleet) -> Producer {
    eventually("a producer to connect", DEADLINE, || async {
        Producer::connect(&fleet.config, secret()).await.ok()
    })
    .await
}

/// Enqueue a wave; every intent must be new and recorded (a failed publish after the
/// record is allowed: the sweeper republishes `planned` rows).
pub(crate) async fn enqueue(producer: &Producer, intents: Vec<Intent>) {
    let n = intents.len();
    let results = producer
        .enqueue_many(intents)
        .await
        .expect("the journal records the wave");
    assert_eq!(results.len(), n);
    for r in results {
        match r {
            Ok(Enqueued::Enqueued { .. }) | Err(ProducerError::Publish(_)) => {}
            other => panic!("every intent of the wave is new and recorded: {other:?}"),
        }
    }
}

/// Every operation succeeded and the provider saw exactly one effect per key.
pub(crate) async fn assert_exactly_once(fleet: &Fleet, n: usize) {
    eventually(
        &format!("all {n} operations to succeed"),
        DEADLINE,
        || async { (count(&fleet.db.pool, "succeeded").await == Some(n as i64)).then_some(()) },
    )
    .await;
    let keys: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM agent_operations")
        .fetch_all(&fleet.db.pool)
        .await
        .expect("keys");
    assert_eq!(keys.len(), n, "one row per intent");
    let effects = fleet.sandbox.effects();
    let dups: Vec<&str> = effects.duplicates().map(|(k, _)| k).collect();
    assert!(dups.is_empty(), "no key with two effects: {dups:?}");
    assert_eq!(effects.total, n as u64, "one effect per key");
    for k in &keys {
        assert_eq!(effects.count(k), 1, "effects of {k}");
    }
}

/// How many broker sessions a worker or reconciler started, from its log.
pub(crate) fn sessions(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("worker consuming") || l.contains("reconciler consuming"))
        .count()
}

/// The workers and reconcilers are still running (they never exited on a fault).
pub(crate) fn assert_alive(procs: &mut [Proc]) {
    for p in procs {
        let state = p.child.try_wait();
        assert!(
            matches!(state, Ok(None)),
            "{} exited ({state:?}); its log:\n{}",
            p.log.display(),
            p.logs()
        );
    }
}

/// A private broker closes every connection, later restarts (gracefully), in the middle
/// of 2,000 intents: workers and the reconciler reconnect by themselves, deliveries of a
/// dead channel are redelivered and deduplicated by the claim, anything the broker lost
/// is republished by the sweeper from the `planned` rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connections_closed_and_restarted_mid_run() {
    let broker = PrivateBroker::start().await;
    let fleet = Fleet::with(FleetOptions {
        amqp_url: Some(broker.url()),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    // Slow the provider a little so that the faults land while work is in flight.
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"latency_ms": 15}))
        .await
        .expect("faults");
    let mut procs = vec![fleet.worker(), fleet.worker(), fleet.reconciler()];
    let mut intents: Vec<Intent> = (0..2000).map(intent).collect();
    let wave3 = intents.split_off(1400);
    let wave2 = intents.split_off(800);
    let wave1 = intents;

    let producer = connect_producer(&fleet).await;
    enqueue(&producer, wave1).await;
    wait_succeeded_at_least(&fleet, 100, "the first wave to be under way").await;
    eprintln!(
        "fault 1 (close all connections) at {:?} of 800 succeeded",
        count(&fleet.db.pool, "succeeded").await
    );
    // Fault 1: every connection (workers', reconciler's, producer's, the fleet's) dies.
    broker.close_all_connections().await;
    drop(producer);

    let producer = connect_producer(&fleet).await;
    enqueue(&producer, wave2).await;
    wait_succeeded_at_least(&fleet, 900, "the second wave to be under way").await;
    eprintln!(
        "fault 2 (restart) at {:?} of 1400 succeeded",
        count(&fleet.db.pool, "succeeded").await
    );
    // Fault 2: the node stops (gracefully) and comes back on the same data.
    broker.restart().await;
    drop(producer);

    let producer = connect_producer(&fleet).await;
    enqueue(&producer, wave3).await;
    drop(producer);

    assert_exactly_once(&fleet, 2000).await;
    // Each process lived through both faults and came back: a session before, one after
    // the connections were closed, one after the restart (at least).
    for p in &procs {
        eventually(
            &format!("{} to reconnect after both faults", p.log.display()),
            DEADLINE,
            || async { (sessions(&p.logs()) >= 3).then_some(()) },
        )
        .await;
    }
    assert_alive(&mut procs);
    drop(procs);
    drop(fleet);
    drop(broker);
}

/// Postgres terminates every backend of the fleet's database three times while 1,000
/// intents run: journal calls are retried on the retryable error, the sweeper and the
/// reconciler carry on at their next pass, nothing runs twice and nobody exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_backends_terminated_mid_run() {
    let fleet = Fleet::with(FleetOptions {
        timeout: "2s".into(),
        lease: "10s".into(),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"latency_ms": 5}))
        .await
        .expect("faults");
    // A connection to the server's maintenance database, so that it survives.
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&oncely_tests::server_url())
        .await
        .expect("admin connection");
    let mut procs = vec![fleet.worker(), fleet.worker(), fleet.reconciler()];
    let producer = fleet.producer().await;
    enqueue(&producer, (0..1000).map(intent).collect()).await;
    drop(producer);

    for (round, at_least) in [(1, 100), (2, 400), (3, 700)] {
        wait_succeeded_at_least(&fleet, at_least, &format!("progress before fault {round}")).await;
        eprintln!(
            "fault {round} (terminate backends) at {:?} of 1000 succeeded",
            count(&fleet.db.pool, "succeeded").await
        );
        let terminated: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE done) FROM (SELECT pg_terminate_backend(pid) AS done \
             FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(&fleet.db.name)
        .fetch_one(&admin)
        .await
        .expect("pg_terminate_backend");
        assert!(
            terminated > 0,
            "fault {round}: some backend of {} was terminated",
            fleet.db.name
        );
    }

    assert_exactly_once(&fleet, 1000).await;
    assert_alive(&mut procs);
}

/// A reconciler that sweeps fast but does not republish `planned` rows within a test's
/// life: what the broker holds must be enough.
const NO_REPUBLISH_RECONCILER: ReconcilerConfig = ReconcilerConfig {
    republish_after: Duration::from_secs(3600),
    ..FAST_RECONCILER
};

/// The process exits 0 within `deadline` (of the SIGTERM just sent): a liveness bound.
async fn exits_zero(p: &mut Proc, deadline: Duration) {
    let status = tokio::time::timeout(deadline, p.child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "did not exit within {deadline:?} of SIGTERM; its log:\n{}",
                p.logs()
            )
        })
        .expect("wait for the process");
    assert!(
        status.success(),
        "SIGTERM exits 0, got {status}; its log:\n{}",
        p.logs()
    );
}

/// SIGTERM in the middle of a run: the worker stops intake, hands buffered deliveries
/// back, lets in-flight calls finish and commit, and exits 0. A new worker (and a
/// reconciler for anything a cut call could have left behind) finishes the rest:
/// nothing lost, nothing executed twice. The reconciler does not republish `planned`
/// rows here, so "nothing lost" means the broker still held every unfinished message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_exits_zero_loses_nothing_and_executes_nothing_twice() {
    let fleet = Fleet::with(FleetOptions {
        lease: "10s".into(),
        reconciler: Some(NO_REPUBLISH_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"latency_ms": 20}))
        .await
        .expect("faults");
    let mut worker = fleet.worker();
    let producer = fleet.producer().await;
    enqueue(&producer, (0..1000).map(intent).collect()).await;
    wait_succeeded_at_least(&fleet, 50, "the worker to be under way").await;

    worker.signal("TERM");
    exits_zero(&mut worker, Duration::from_secs(30)).await;
    // In-flight calls were waited for and committed: nothing is left mid-call.
    let executing = count(&fleet.db.pool, "executing").await.expect("count");
    assert_eq!(
        executing,
        0,
        "no operation left executing by a graceful stop; log:\n{}",
        worker.logs()
    );
    eprintln!(
        "stopped with {:?} of 1000 succeeded",
        count(&fleet.db.pool, "succeeded").await
    );

    let mut procs = vec![fleet.worker(), fleet.reconciler()];
    assert_exactly_once(&fleet, 1000).await;
    assert_alive(&mut procs);
}

/// SIGTERM while RabbitMQ has stopped answering (a frozen proxy: connections open, nothing
/// forwarded): every step of the worker's stop that waits on the broker (the consumers'
/// cancel, the connection close) gives up after its bound, and the worker exits 0 instead
/// of waiting forever. Before the bound, lapin's cancel and close waited with no limit:
/// the same hang that once kept the demo (and CI) from ending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_even_when_the_broker_stopped_answering() {
    let fleet = Fleet::new().await;
    let proxy = oncely_tests::proxy::Proxy::start(5672).await;
    let url = fleet
        .config
        .broker
        .url
        .replace(":5672/", &format!(":{}/", proxy.port));
    assert_ne!(url, fleet.config.broker.url, "the broker is on port 5672");
    let mut worker = fleet.spawn_with_env(&["run"], &[("ONCELY_AMQP_URL", &url)]);
    let producer = fleet.producer().await;
    enqueue(&producer, (0..3).map(intent).collect()).await;
    wait_succeeded_at_least(&fleet, 3, "the worker to consume through the proxy").await;

    proxy.freeze();
    worker.signal("TERM");
    exits_zero(&mut worker, Duration::from_secs(60)).await;
    let logs = worker.logs();
    assert!(
        logs.contains("did not answer the consumers' cancel in time")
            && logs.contains("did not answer the connection close in time"),
        "the bounds, not the broker, ended the stop; its log:\n{logs}"
    );
}
