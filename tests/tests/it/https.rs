//! HTTPS to providers and their credentials, against the sandbox's real TLS listener
//! (rustls, with a CA made in the test by rcgen): where "not sent" ends (the end of the
//! handshake), certificate errors, TLS-layer faults, a reset after the request, and
//! credentials read from the environment or a file — end to end through real processes.

use oncely_core::config::{Config, HttpProviderConfig, ProviderConfig, ValueSource};
use oncely_core::{IdempotencyKey, Intent};
use oncely_sandbox::{FaultMode, FaultRule, Faults, Sandbox};
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions};
use oncely_tests::tls::{TestCa, Validity};
use oncely_tests::{eventually, unique_name};
use oncely_worker::provider::{Call, Outcome, Provider, Remote};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
/// Marks the bearer token: it must never show up in a log.
const TOKEN_MARKER: &str = "tok-MARKER-5b1e";

pub(super) fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name("https"));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// The built-in `bank` provider pointed at `base_url`, changed by `change`.
pub(super) fn bank(
    base_url: &str,
    change: impl FnOnce(&mut HttpProviderConfig),
) -> Arc<dyn Provider> {
    let mut config = Config::builtin().expect("built-in config");
    config.providers.retain(|name, _| name == "bank");
    let Some(ProviderConfig::Http(http)) = config.providers.get_mut("bank") else {
        panic!("the built-in config has an http bank");
    };
    http.base_url = base_url.to_owned();
    http.connect_timeout = Duration::from_millis(500);
    http.timeout = Duration::from_secs(2);
    change(http);
    config.providers["bank"]
        .validate("providers.bank")
        .expect("a valid provider");
    oncely_worker::provider::build(&config)
        .expect("builds")
        .remove("bank")
        .expect("bank")
}

fn key(n: u8) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("v1:{}", format!("{n:02x}").repeat(32))).expect("key")
}

pub(super) fn payment(n: u8) -> Map<String, Value> {
    let Value::Object(map) = json!({
        "account_id": "acc-1", "amount_minor": 1000 + u32::from(n), "currency": "EUR",
        "business_reference": format!("inv-{n}")
    }) else {
        unreachable!()
    };
    map
}

/// A payment call with `key` and `payload`.
pub(super) fn payment_call<'a>(
    key: &'a IdempotencyKey,
    payload: &'a Map<String, Value>,
) -> Call<'a> {
    Call {
        key,
        action_type: "payment_order.create",
        payload,
        first_attempt_at: None,
    }
}

async fn execute(provider: &dyn Provider, n: u8) -> Outcome {
    let (key, payload) = (key(n), payment(n));
    provider.execute(payment_call(&key, &payload)).await
}

async fn lookup(provider: &dyn Provider, n: u8) -> Remote {
    let (key, payload) = (key(n), payment(n));
    provider.lookup(payment_call(&key, &payload)).await
}

/// A sandbox with a TLS listener presenting `validity`'s certificate for `names`.
async fn tls_sandbox(ca: &TestCa, names: &[&str], validity: Validity) -> (Sandbox, String) {
    let local = "127.0.0.1:0".parse().expect("addr");
    let mut sandbox = oncely_sandbox::spawn(local).await.expect("sandbox");
    let addr = sandbox
        .serve_tls(local, ca.server_config(names, validity))
        .await
        .expect("TLS listener");
    (sandbox, format!("https://localhost:{}", addr.port()))
}

fn code(outcome: &Outcome) -> (&'static str, String) {
    match outcome {
        Outcome::Succeeded { .. } => ("succeeded", String::new()),
        Outcome::InFlight => ("in_flight", String::new()),
        Outcome::Rejected { code } => ("rejected", code.clone()),
        Outcome::NotSent { code } => ("not_sent", code.clone()),
        Outcome::Throttled { code, .. } => ("throttled", code.clone()),
        Outcome::Unknown { code } => ("unknown", code.clone()),
    }
}

#[tokio::test]
async fn a_call_over_tls_trusting_the_ca_file_succeeds_and_is_found_by_lookup() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let (sandbox, url) = tls_sandbox(&ca, &["localhost"], Validity::Current).await;
    let provider = bank(&url, |p| p.ca_file = Some(ca.ca_file().to_owned()));

    let outcome = execute(provider.as_ref(), 1).await;
    assert_eq!(code(&outcome).0, "succeeded", "{outcome:?}");
    assert!(matches!(
        lookup(provider.as_ref(), 1).await,
        Remote::Succeeded { .. }
    ));
    // The same key again: the provider replays, no second effect.
    assert_eq!(code(&execute(provider.as_ref(), 1).await).0, "succeeded");
    assert_eq!(sandbox.effects().count(key(1).as_str()), 1);
}

#[tokio::test]
async fn a_certificate_the_client_cannot_trust_is_not_sent_and_reaches_nobody() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let stranger = TestCa::new(&dir, "stranger");
    let cases = [
        (
            "another CA",
            &stranger,
            &["localhost"][..],
            Validity::Current,
        ),
        ("expired", &ca, &["localhost"][..], Validity::Expired),
        (
            "another host",
            &ca,
            &["bank.example"][..],
            Validity::Current,
        ),
    ];
    for (case, signer, names, validity) in cases {
        let (sandbox, url) = tls_sandbox(signer, names, validity).await;
        let provider = bank(&url, |p| p.ca_file = Some(ca.ca_file().to_owned()));
        let outcome = execute(provider.as_ref(), 2).await;
        assert_eq!(
            code(&outcome),
            ("not_sent", "tls_certificate".to_owned()),
            "{case}"
        );
        let stats = sandbox.control().stats().await.expect("stats");
        assert_eq!(stats["executes"]["bank"], json!(0), "{case}: {stats}");
    }
    // No ca_file: the system's roots do not know the test CA either.
    let (_sandbox, url) = tls_sandbox(&ca, &["localhost"], Validity::Current).await;
    let provider = bank(&url, |_| {});
    assert_eq!(
        code(&execute(provider.as_ref(), 2).await),
        ("not_sent", "tls_certificate".to_owned()),
        "system roots"
    );
}

#[tokio::test]
async fn faults_before_the_handshake_is_done_are_not_sent_and_a_reset_after_is_unknown() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let (sandbox, url) = tls_sandbox(&ca, &["localhost"], Validity::Current).await;
    let provider = bank(&url, |p| p.ca_file = Some(ca.ca_file().to_owned()));
    let set = |faults: Faults| sandbox.set_faults(faults).expect("faults");

    set(Faults {
        tls_drop_rate: 1.0,
        ..Faults::default()
    });
    assert_eq!(
        code(&execute(provider.as_ref(), 3).await),
        ("not_sent", "tls_handshake".to_owned())
    );
    set(Faults {
        tls_stall_rate: 1.0,
        ..Faults::default()
    });
    assert_eq!(
        code(&execute(provider.as_ref(), 3).await),
        ("not_sent", "connect_timeout".to_owned())
    );
    let stats = sandbox.control().stats().await.expect("stats");
    assert_eq!(stats["executes"]["bank"], json!(0), "{stats}");
    assert_eq!(stats["faults"]["tls_dropped"], json!(1), "{stats}");
    assert_eq!(stats["faults"]["tls_stalled"], json!(1), "{stats}");

    // After the handshake the request is written: a reset now is unknown, and the
    // effect may well have happened (here it did) — the lookup tells.
    set(Faults {
        rules: vec![FaultRule::new(FaultMode::AcceptThenReset).times(1)],
        ..Faults::default()
    });
    let outcome = execute(provider.as_ref(), 4).await;
    assert_eq!(code(&outcome).0, "unknown", "{outcome:?}");
    assert!(matches!(
        lookup(provider.as_ref(), 4).await,
        Remote::Succeeded { .. }
    ));
    assert_eq!(sandbox.effects().count(key(4).as_str()), 1);
}

#[tokio::test]
async fn credentials_from_a_file_reach_the_provider_and_refusals_are_rejected() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let (sandbox, url) = tls_sandbox(&ca, &["localhost"], Validity::Current).await;
    let token = format!("sk_{TOKEN_MARKER}");
    sandbox.require_header("Authorization", &format!("Bearer {token}"));
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");

    let with_token = bank(&url, |p| {
        p.ca_file = Some(ca.ca_file().to_owned());
        p.headers.insert(
            "Authorization".into(),
            ValueSource::File {
                path: token_file.clone(),
                prefix: "Bearer ".into(),
            },
        );
    });
    assert_eq!(code(&execute(with_token.as_ref(), 5).await).0, "succeeded");
    assert!(matches!(
        lookup(with_token.as_ref(), 5).await,
        Remote::Succeeded { .. }
    ));
    assert!(!format!("{with_token:?}").contains(TOKEN_MARKER));

    // A wrong token: 401 is rejected for good (not retried), lookups fail.
    let wrong = bank(&url, |p| {
        p.ca_file = Some(ca.ca_file().to_owned());
        p.headers.insert(
            "Authorization".into(),
            ValueSource::Literal("Bearer sk_wrong".into()),
        );
    });
    assert_eq!(
        code(&execute(wrong.as_ref(), 6).await),
        ("rejected", "http_401".to_owned())
    );
    assert!(
        matches!(lookup(wrong.as_ref(), 6).await, Remote::Failed { code } if code == "http_401")
    );
    assert_eq!(sandbox.effects().count(key(6).as_str()), 0);
}

fn bearer_from_env(config: &mut Config) {
    for provider in config.providers.values_mut() {
        let ProviderConfig::Http(http) = provider else {
            continue;
        };
        http.headers.insert(
            "Authorization".into(),
            ValueSource::Env {
                var: "ONCELY_TEST_BANK_TOKEN".into(),
                prefix: "Bearer ".into(),
            },
        );
    }
}

fn tls_fleet() -> FleetOptions {
    FleetOptions {
        tls: &["bank"],
        reconciler: Some(FAST_RECONCILER),
        configure: Some(bearer_from_env),
        ..FleetOptions::default()
    }
}

fn order(n: usize) -> Intent {
    Intent::from_json(json!({
        "action_type": "payment_order.create", "workflow_id": "https", "step": "pay",
        "business_object": format!("order-{n}"), "revision": 1,
        "payload": {"account_id": "acc-1", "amount_minor": 100 + n, "currency": "EUR",
                    "business_reference": format!("https-{n}")}
    }))
    .expect("intent")
}

/// `n` payment orders enqueued, then waited for until all are in `status`.
async fn enqueue_and_wait(fleet: &Fleet, n: usize, status: &str) {
    let producer = fleet.producer().await;
    for r in producer
        .enqueue_many((0..n).map(order).collect())
        .await
        .expect("enqueue")
    {
        r.expect("enqueued");
    }
    eventually(&format!("every payment is {status}"), DEADLINE, || async {
        (fleet.count(status).await == n as i64).then_some(())
    })
    .await;
}

/// Through real processes over TLS: handshake drops (not sent → retried) and resets after
/// the request (unknown → reconciled) still give one effect per key; the token is used
/// but never logged, even at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_faults_each_payment_happens_once_and_the_token_stays_out_of_logs() {
    let fleet = Fleet::with(tls_fleet()).await;
    let token = format!("sk_live_{TOKEN_MARKER}");
    fleet
        .sandbox
        .require_header("Authorization", &format!("Bearer {token}"));
    fleet
        .sandbox
        .set_faults(Faults {
            seed: 7,
            tls_drop_rate: 0.3,
            rules: vec![FaultRule::new(FaultMode::AcceptThenReset).rate(0.2)],
            ..Faults::default()
        })
        .expect("faults");
    let env = [
        ("ONCELY_TEST_BANK_TOKEN", token.as_str()),
        ("RUST_LOG", "debug"),
    ];
    let procs = [
        fleet.spawn_with_env(&["run"], &env),
        fleet.spawn_with_env(&["reconcile"], &env),
    ];
    let n = 30;
    enqueue_and_wait(&fleet, n, "succeeded").await;
    let effects = fleet.sandbox.effects();
    assert_eq!(effects.total, n as u64, "one effect per payment");
    assert_eq!(effects.duplicates().count(), 0);
    let stats = fleet.sandbox.control().stats().await.expect("stats");
    assert!(
        stats["faults"]["tls_dropped"].as_u64() > Some(0)
            && stats["faults"]["accept_then_reset"].as_u64() > Some(0),
        "both kinds of fault happened: {stats}"
    );
    assert_eq!(stats["unauthorized_401"], json!(0), "{stats}");
    let logs: String = procs.iter().map(|p| p.logs()).collect();
    assert!(logs.contains("provider execute"), "debug logs were on");
    assert!(!logs.contains(TOKEN_MARKER), "the token leaked into a log");
}

/// A missing credential stops the worker at startup, naming the provider and the
/// variable — no request without the token is ever made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_credential_stops_the_worker_before_any_request() {
    let fleet = Fleet::with(tls_fleet()).await;
    let mut worker = fleet.spawn(&["run"]);
    let status = tokio::time::timeout(DEADLINE, worker.child.wait())
        .await
        .expect("the worker exits")
        .expect("wait");
    assert!(!status.success());
    let logs = worker.logs();
    assert!(
        logs.contains("providers.bank.headers.Authorization")
            && logs.contains("ONCELY_TEST_BANK_TOKEN is not set"),
        "{logs}"
    );
    let stats = fleet.sandbox.control().stats().await.expect("stats");
    assert_eq!(stats["executes"]["bank"], json!(0));
}

/// Wrong credentials: every payment fails final with `http_401`, nothing happens at
/// the provider, and the refusal is logged once for the provider, not per payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_fails_the_operations_and_is_reported_once() {
    let fleet = Fleet::with(tls_fleet()).await;
    fleet
        .sandbox
        .require_header("Authorization", "Bearer sk_the_right_one");
    let worker = fleet.spawn_with_env(&["run"], &[("ONCELY_TEST_BANK_TOKEN", "sk_wrong")]);
    let n = 5;
    enqueue_and_wait(&fleet, n, "failed_final").await;
    let codes: Vec<Option<String>> =
        sqlx::query_scalar("SELECT last_error_code FROM agent_operations")
            .fetch_all(&fleet.db.pool)
            .await
            .expect("codes");
    assert!(
        codes.iter().all(|c| c.as_deref() == Some("http_401")),
        "{codes:?}"
    );
    assert_eq!(fleet.sandbox.effects().total, 0);
    let refusals = worker
        .logs()
        .matches("refused oncely's credentials")
        .count();
    assert_eq!(refusals, 1, "logged once per provider");
}
