//! oncely through pgbouncer in transaction pooling mode (a real Debian pgbouncer 1.18,
//! private to each test, with fewer server connections than clients): what breaks
//! without `database_pooler = "transaction"`, and the pipeline — SDK producers, workers,
//! a reconciler, the gateway with its Idempotency-Key rows, an admin command — running
//! through it with each action executed once.

use oncely_core::db::PoolSettings;
use oncely_core::{Db, Intent};
use oncely_tests::eventually;
use oncely_tests::fleet::{Fleet, secret};
use oncely_tests::gateway::{Gateway, TOKEN_A};
use oncely_tests::pgbouncer::Pgbouncer;
use oncely_tests::{TestDb, server_url};
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

fn intent(n: usize) -> Intent {
    oncely_tests::sample_intent(
        ["email.send", "ticket.create", "payment_order.create"][n % 3],
        n,
    )
}

/// The statement every client runs below: one the journal runs too.
const SQL: &str = "SELECT count(*) FROM agent_operations WHERE status = $1";

async fn run_on(db: &Db, n: usize) -> Result<(), sqlx::Error> {
    for i in 0..n {
        let status = ["planned", "succeeded"][i % 2];
        let _: i64 = sqlx::query_scalar(SQL).bind(status).fetch_one(db).await?;
    }
    Ok(())
}

/// What breaks: sqlx's default — named prepared statements, cached per client connection
/// — behind a transaction pooler whose one server connection two clients share: the
/// second client's `Parse` of the same name meets the first's statement (42P05), or a
/// cached statement is looked for on a server that never saw it (26000). With pooler mode
/// (no cache, each statement unnamed in a transaction of its own) the same clients run
/// the same statements concurrently without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_defaults_break_behind_pgbouncer_and_pooler_mode_does_not() {
    let db = TestDb::new().await;
    let bouncer = Pgbouncer::start(&server_url(), 1, &["postgres"]).await;
    let url = bouncer.url_for(&db.url);

    let direct = PoolSettings {
        max_connections: 1,
        ..PoolSettings::default()
    };
    let a = Db::direct(oncely_core::db::connect(&url, &direct).await.expect("a"));
    let b = Db::direct(oncely_core::db::connect(&url, &direct).await.expect("b"));
    run_on(&a, 2).await.expect("the first client alone is fine");
    let err = run_on(&b, 2)
        .await
        .expect_err("two clients' named statements on one server connection");
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert!(
        matches!(code.as_deref(), Some("42P05" | "26000")),
        "{err} ({code:?})"
    );

    let pooled = PoolSettings {
        max_connections: 4,
        pooler: true,
        ..PoolSettings::default()
    };
    let mut clients = Vec::new();
    for _ in 0..4 {
        let pool = oncely_core::db::connect(&url, &pooled)
            .await
            .expect("pooled");
        clients.push(Db::new(pool, true));
    }
    let runs = clients.iter().map(|c| run_on(c, 200));
    for r in futures_util::future::join_all(runs).await {
        r.expect("pooler mode: 4 clients × 200 statements over one server connection");
    }
}

/// The pipeline through pgbouncer (3 server connections for every client of the fleet's
/// database): 2 SDK producers (600 intents, 200 of them repeats, concurrently), 2 workers,
/// a reconciler, a gateway (with `Idempotency-Key` headers), `admin ops list` — each
/// distinct action executed once, every process's log free of prepared-statement errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_once_per_action_through_pgbouncer_in_transaction_mode() {
    let fleet = Fleet::new().await;
    let bouncer = Pgbouncer::start(&server_url(), 3, &["postgres"]).await;
    let url = bouncer.url_for(&fleet.db.url);
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("ONCELY_DATABASE_POOLER", "transaction"),
    ];
    let mut procs: Vec<_> = (0..2)
        .map(|_| fleet.spawn_with_env(&["run"], &env))
        .collect();
    procs.push(fleet.spawn_with_env(&["reconcile"], &env));

    let mut config = fleet.producer_config();
    config.database_url = url.clone();
    config.database_pooler = oncely_core::config::DatabasePooler::Transaction;
    let (pa, pb) = (
        oncely_producer::Producer::connect(&config, secret())
            .await
            .expect("producer a through pgbouncer"),
        oncely_producer::Producer::connect(&config, secret())
            .await
            .expect("producer b through pgbouncer"),
    );
    let a: Vec<Intent> = (0..400).map(intent).collect();
    let b: Vec<Intent> = (200..600).map(intent).collect();
    let (ra, rb) = tokio::join!(pa.enqueue_many(a), pb.enqueue_many(b));
    let new = ra
        .expect("enqueue a")
        .into_iter()
        .chain(rb.expect("enqueue b"))
        .map(|r| r.expect("each enqueue"))
        .filter(|r| matches!(r, oncely_producer::Enqueued::Enqueued { .. }))
        .count();
    assert_eq!(new, 600, "each distinct intent recorded once");

    // The gateway through pgbouncer: a request with an Idempotency-Key, and its repeat.
    let gw = Gateway::start_with(&fleet, &[TOKEN_A], &env, &[]).await;
    let mut agent = gw.client(TOKEN_A.token).await;
    let body = json!({"workflow_id": "case-gw", "step": "notify", "business_object": "obj-gw", "revision": 1,
        "payload": {"to": "gw@example.test", "subject": "Approved"}});
    let mut send = async || {
        agent
            .request(
                "POST",
                "/v1/actions/email.send",
                &[("idempotency-key", "gw-req-1")],
                body.to_string().into_bytes(),
            )
            .await
    };
    let first = send().await;
    assert_eq!(first.status, 202, "{}", first.body);
    let again = send().await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(first.body["key"], again.body["key"]);

    eventually("every distinct action succeeded", DEADLINE, || async {
        (fleet.count("succeeded").await == 601).then_some(())
    })
    .await;
    let effects = fleet.sandbox.effects();
    assert_eq!(effects.total, 601, "one effect per distinct key");
    // It all went through pgbouncer: claims and completions of 601 actions take at least
    // ⌈601 / 64⌉ statements each (batches of at most 64), each its own transaction.
    let xacts = bouncer.transactions(&fleet.db.name).await;
    assert!(
        xacts >= 2 * 601_u64.div_ceil(64) as i64,
        "pgbouncer passed {xacts} transactions"
    );
    eprintln!(
        "pgbouncer passed {xacts} transactions for {}",
        fleet.db.name
    );
    assert_eq!(effects.duplicates().count(), 0);

    let (code, out, err) = fleet.admin_with_env(&["ops", "list"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("succeeded"), "{out}");

    for log in procs
        .iter()
        .map(|p| p.logs())
        .chain(std::iter::once(gw.proc.logs()))
    {
        assert!(
            !log.contains("prepared statement") && !log.contains("42P05") && !log.contains("26000"),
            "{log}"
        );
    }
    assert!(
        !bouncer.log().contains("ERROR"),
        "pgbouncer logged errors:\n{}",
        bouncer.log()
    );
}
