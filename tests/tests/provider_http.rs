//! The generic HTTP provider adapter against a real in-process sandbox.
//!
//! Why against the sandbox and not a mock: the adapter's whole job is to tell "never
//! sent" from "sent, no answer" on real sockets (refused connections, resets, held
//! requests), and the sandbox's effect ledger is the ground truth for "the effect
//! happened once". Each test starts its own sandbox, so tests run in parallel.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use oncely_core::IdempotencyKey;
use oncely_core::config::{Config, DEFAULT_CONFIG, ProviderConfig};
use oncely_sandbox::{FaultMode, FaultRule, Faults, Provider as SandboxProvider, Sandbox};
use oncely_worker::provider::{self, Call, HttpProvider, Outcome, Provider, Remote};
use serde_json::{Map, Value, json};

type Result<T = ()> = anyhow::Result<T>;

/// The bank provider with both lookups, default timeouts.
const BOTH_LOOKUPS: &str = r#"
lookup_path = "/v1/payment-orders?idempotency_key={key}"
lookup_by_reference_path = "/v1/payment-orders?reference={reference}"
"#;

async fn start() -> Result<Sandbox> {
    oncely_sandbox::spawn("127.0.0.1:0".parse()?).await
}

/// One `[providers.bank]` at `base_url` plus `extra` TOML lines, built with `build()`.
fn bank(base_url: &str, extra: &str) -> Result<Arc<dyn Provider>> {
    let text = format!(
        "[providers.bank]\nbase_url = \"{base_url}\"\nexecute_path = \"/v1/payment-orders\"\n{extra}\n"
    );
    let config = Config::from_toml(&text, "test", std::iter::empty())?;
    let mut providers = provider::build(&config)?;
    providers
        .remove("bank")
        .ok_or_else(|| anyhow::anyhow!("no bank provider built"))
}

/// A distinct key per test (each test has its own sandbox anyway).
fn key(n: u32) -> IdempotencyKey {
    IdempotencyKey::parse(&format!("v1:{n:064x}")).expect("a valid key")
}

fn payload(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("payload must be an object, got {other}"),
    }
}

fn call<'a>(key: &'a IdempotencyKey, payload: &'a Map<String, Value>) -> Call<'a> {
    Call {
        key,
        action_type: "payment_order.create",
        payload,
        first_attempt_at: None,
    }
}

fn faults(rules: Vec<FaultRule>) -> Faults {
    Faults {
        rules,
        ..Faults::default()
    }
}

/// Polls `check` until it yields `Some`, failing the test after a deadline.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn succeeded_id(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Succeeded {
            provider_operation_id,
            ..
        } => provider_operation_id.clone(),
        other => panic!("expected Succeeded, got {other:?}"),
    }
}

#[tokio::test]
async fn success_then_replay_gives_the_same_id_and_one_effect() -> Result {
    let sb = start().await?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let k = key(1);
    let body = payload(json!({"amount": 1200, "currency": "EUR", "business_reference": "inv-1"}));

    let first = p.execute(call(&k, &body)).await;
    let id = succeeded_id(&first);
    assert!(id.starts_with("po_"), "{id}");
    if let Outcome::Succeeded { result, .. } = &first {
        assert_eq!(result["idempotency_key"], k.as_str());
        assert_eq!(result["status"], "succeeded");
    }
    let again = p.execute(call(&k, &body)).await;
    assert_eq!(succeeded_id(&again), id);
    assert_eq!(sb.effects().count(k.as_str()), 1);
    assert_eq!(sb.control().effect_count(k.as_str()).await?, 1);

    match p.lookup(call(&k, &body)).await {
        Remote::Succeeded {
            provider_operation_id,
            ..
        } => assert_eq!(provider_operation_id, id),
        other => panic!("expected Succeeded, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn same_key_with_another_body_is_rejected() -> Result {
    let sb = start().await?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let k = key(2);
    let body = payload(json!({"amount": 1, "business_reference": "inv-2"}));
    let other = payload(json!({"amount": 2, "business_reference": "inv-2"}));
    succeeded_id(&p.execute(call(&k, &body)).await);
    assert_eq!(
        p.execute(call(&k, &other)).await,
        Outcome::Rejected {
            code: "http_422".into()
        }
    );
    assert_eq!(sb.effects().count(k.as_str()), 1);
    Ok(())
}

#[tokio::test]
async fn connection_refused_is_not_sent_and_lookup_fails() -> Result {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?.port()
    };
    let p = bank(&format!("http://127.0.0.1:{port}"), BOTH_LOOKUPS)?;
    let k = key(3);
    let body = payload(json!({"amount": 1, "business_reference": "inv-3"}));
    assert_eq!(
        p.execute(call(&k, &body)).await,
        Outcome::NotSent {
            code: "connect_failed".into()
        }
    );
    assert_eq!(
        p.lookup(call(&k, &body)).await,
        Remote::Failed {
            code: "connect_failed".into()
        }
    );
    Ok(())
}

#[tokio::test]
async fn accept_then_timeout_is_unknown_and_lookup_finds_the_effect() -> Result {
    let sb = start().await?;
    let k = key(4);
    sb.set_faults(faults(vec![
        FaultRule::new(FaultMode::AcceptThenTimeout)
            .key(k.as_str())
            .hold_ms(3_000),
    ]))?;
    let p = bank(
        &sb.base_url(),
        &format!("{BOTH_LOOKUPS}connect_timeout = \"200ms\"\ntimeout = \"300ms\"\n"),
    )?;
    let body = payload(json!({"amount": 4, "business_reference": "inv-4"}));

    assert_eq!(
        p.execute(call(&k, &body)).await,
        Outcome::Unknown {
            code: "timeout".into()
        }
    );
    assert_eq!(sb.effects().count(k.as_str()), 1);
    let id = match p.lookup(call(&k, &body)).await {
        Remote::Succeeded {
            provider_operation_id,
            ..
        } => provider_operation_id,
        other => panic!("expected Succeeded, got {other:?}"),
    };
    // A retry with the same key gets the saved answer: same id, still one effect.
    assert_eq!(succeeded_id(&p.execute(call(&k, &body)).await), id);
    assert_eq!(sb.effects().count(k.as_str()), 1);
    Ok(())
}

#[tokio::test]
async fn accept_then_reset_is_unknown_not_not_sent() -> Result {
    let sb = start().await?;
    let k = key(5);
    sb.set_faults(faults(vec![
        FaultRule::new(FaultMode::AcceptThenReset).key(k.as_str()),
    ]))?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let body = payload(json!({"amount": 5, "business_reference": "inv-5"}));

    let outcome = p.execute(call(&k, &body)).await;
    assert!(
        matches!(outcome, Outcome::Unknown { .. }),
        "expected Unknown, got {outcome:?}"
    );
    assert_eq!(sb.effects().count(k.as_str()), 1);
    assert!(matches!(
        p.lookup(call(&k, &body)).await,
        Remote::Succeeded { .. }
    ));
    Ok(())
}

#[tokio::test]
async fn error_before_commit_is_unknown_and_lookup_proves_absence() -> Result {
    let sb = start().await?;
    let k = key(6);
    sb.set_faults(faults(vec![
        FaultRule::new(FaultMode::ErrorBeforeCommit).key(k.as_str()),
    ]))?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let body = payload(json!({"amount": 6, "business_reference": "inv-6"}));

    assert_eq!(
        p.execute(call(&k, &body)).await,
        Outcome::Unknown {
            code: "http_503".into()
        }
    );
    assert_eq!(sb.effects().count(k.as_str()), 0);
    // Absent by key, then absent by reference.
    assert_eq!(p.lookup(call(&k, &body)).await, Remote::Absent);
    Ok(())
}

#[tokio::test]
async fn reject_fault_is_rejected_and_lookup_says_rejected() -> Result {
    let sb = start().await?;
    let k = key(7);
    sb.set_faults(faults(vec![
        FaultRule::new(FaultMode::Reject).key(k.as_str()),
    ]))?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let body = payload(json!({"amount": 7, "business_reference": "inv-7"}));

    assert_eq!(
        p.execute(call(&k, &body)).await,
        Outcome::Rejected {
            code: "http_422".into()
        }
    );
    assert_eq!(
        p.lookup(call(&k, &body)).await,
        Remote::Rejected {
            code: "remote_rejected".into()
        }
    );
    assert_eq!(sb.effects().count(k.as_str()), 0);
    Ok(())
}

#[tokio::test]
async fn concurrent_same_key_is_in_flight_and_lookup_is_pending() -> Result {
    let sb = start().await?;
    let k = key(8);
    sb.set_faults(faults(vec![
        FaultRule::new(FaultMode::Latency)
            .key(k.as_str())
            .latency_ms(1_500)
            .times(1),
    ]))?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let body = payload(json!({"amount": 8, "business_reference": "inv-8"}));

    let first = {
        let (p, k, body) = (p.clone(), k.clone(), body.clone());
        tokio::spawn(async move { p.execute(call(&k, &body)).await })
    };
    // Wait until the provider has admitted the first request.
    let (pr, kr, br) = (&p, &k, &body);
    eventually("the first request to be in flight", || async move {
        match pr.lookup(call(kr, br)).await {
            Remote::Pending => Some(()),
            Remote::Absent => None,
            other => panic!("expected Pending or Absent, got {other:?}"),
        }
    })
    .await;
    assert_eq!(p.execute(call(&k, &body)).await, Outcome::InFlight);
    let id = succeeded_id(&first.await?);
    assert_eq!(sb.effects().count(k.as_str()), 1);
    match p.lookup(call(&k, &body)).await {
        Remote::Succeeded {
            provider_operation_id,
            ..
        } => assert_eq!(provider_operation_id, id),
        other => panic!("expected Succeeded, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn disabled_lookup_fails_and_no_lookup_is_unsupported() -> Result {
    let sb = start().await?;
    sb.set_faults(Faults {
        lookup_disabled: vec![SandboxProvider::Bank],
        ..Faults::default()
    })?;
    let k = key(9);
    let body = payload(json!({"amount": 9, "business_reference": "inv-9"}));

    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    assert!(p.capabilities().lookup);
    succeeded_id(&p.execute(call(&k, &body)).await);
    assert_eq!(
        p.lookup(call(&k, &body)).await,
        Remote::Failed {
            code: "http_503".into()
        }
    );

    let none = bank(&sb.base_url(), "")?;
    assert!(!none.capabilities().lookup);
    assert_eq!(none.lookup(call(&k, &body)).await, Remote::Unsupported);
    Ok(())
}

#[tokio::test]
async fn lookup_by_reference_alone_checks_whose_record_it_is() -> Result {
    let sb = start().await?;
    let p = bank(
        &sb.base_url(),
        "lookup_by_reference_path = \"/v1/payment-orders?reference={reference}\"\n",
    )?;
    assert!(p.capabilities().lookup);
    let (mine, other, fresh) = (key(10), key(11), key(12));
    let body = payload(json!({"amount": 10, "business_reference": "inv 10/a:b"}));

    let id = succeeded_id(&p.execute(call(&mine, &body)).await);
    match p.lookup(call(&mine, &body)).await {
        Remote::Succeeded {
            provider_operation_id,
            ..
        } => assert_eq!(provider_operation_id, id),
        other => panic!("expected Succeeded, got {other:?}"),
    }
    // Another key whose payload names the same reference: that record is not ours.
    assert_eq!(
        p.lookup(call(&other, &body)).await,
        Remote::Failed {
            code: "reference_other_key".into()
        }
    );
    // A reference nobody used.
    let unused = payload(json!({"amount": 12, "business_reference": "inv-12"}));
    assert_eq!(p.lookup(call(&fresh, &unused)).await, Remote::Absent);
    // No reference in the payload: nothing to ask.
    let bare = payload(json!({"amount": 12}));
    assert_eq!(p.lookup(call(&fresh, &bare)).await, Remote::Unsupported);
    Ok(())
}

#[tokio::test]
async fn statuses_and_missing_ids_are_classified() -> Result {
    let sb = start().await?;
    let cases = [
        // A throttle: deferred, not spent (no Retry-After here: the fleet's default wait).
        (
            429,
            Outcome::Throttled {
                code: "http_429".into(),
                retry_after: None,
            },
        ),
        (
            408,
            Outcome::NotSent {
                code: "http_408".into(),
            },
        ),
        // Without a Retry-After a 503 may have been answered after the provider acted.
        (
            503,
            Outcome::Unknown {
                code: "http_503".into(),
            },
        ),
        (
            401,
            Outcome::Rejected {
                code: "http_401".into(),
            },
        ),
        (
            400,
            Outcome::Rejected {
                code: "http_400".into(),
            },
        ),
        (
            502,
            Outcome::Unknown {
                code: "http_502".into(),
            },
        ),
    ];
    let rules = cases
        .iter()
        .enumerate()
        .map(|(i, (status, _))| {
            FaultRule::new(FaultMode::ErrorBeforeCommit)
                .key(key(20 + i as u32).as_str())
                .status(*status)
        })
        .collect();
    sb.set_faults(faults(rules))?;
    let p = bank(&sb.base_url(), BOTH_LOOKUPS)?;
    let body = payload(json!({"amount": 20}));
    for (i, (_, expected)) in cases.iter().enumerate() {
        let k = key(20 + i as u32);
        assert_eq!(&p.execute(call(&k, &body)).await, expected);
        assert_eq!(sb.effects().count(k.as_str()), 0);
    }

    // A 2xx without an id where the config says to look: the effect happened, unknown which.
    let no_id = bank(&sb.base_url(), "id_pointer = \"/data/id\"\n")?;
    let k = key(30);
    assert_eq!(
        no_id.execute(call(&k, &body)).await,
        Outcome::Unknown {
            code: "no_provider_id".into()
        }
    );
    assert_eq!(sb.effects().count(k.as_str()), 1);
    Ok(())
}

#[tokio::test]
async fn build_makes_one_provider_per_configured_name() -> Result {
    let config = Config::from_toml(DEFAULT_CONFIG, "default", std::iter::empty())?;
    let providers = provider::build(&config)?;
    assert_eq!(
        providers.keys().map(String::as_str).collect::<Vec<_>>(),
        ["bank", "mail", "tickets"]
    );
    for (name, p) in &providers {
        assert_eq!(p.name(), name);
        let caps = p.capabilities();
        assert!(caps.lookup && caps.honours_key && !caps.absence_authoritative);
        assert_eq!(caps.key_retention, Some(Duration::from_secs(24 * 3600)));
    }

    let text = "[providers.a]\nbase_url = \"http://127.0.0.1:1\"\nexecute_path = \"/x\"\nhonours_key = false\nabsence_authoritative = true\n\
                [providers.b]\nbase_url = \"http://127.0.0.1:2/\"\nexecute_path = \"/y\"\nlookup_path = \"/y/{key}\"\n";
    let providers = provider::build(&Config::from_toml(text, "test", std::iter::empty())?)?;
    assert_eq!(providers.len(), 2);
    let a = providers["a"].capabilities();
    assert!(!a.honours_key && a.absence_authoritative && !a.lookup && a.key_retention.is_none());
    assert!(providers["b"].capabilities().lookup);

    // Errors name the field.
    let bad = "[providers.bank]\nbase_url = \"http://127.0.0.1:1\"\nexecute_path = \"/x\"\nid_pointer = \"id\"\n";
    let err = Config::from_toml(bad, "test", std::iter::empty())
        .expect_err("a bad pointer")
        .to_string();
    assert!(err.contains("providers.bank.id_pointer"), "{err}");
    let bad = "[providers.bank]\nbase_url = \"http://127.0.0.1:1\"\nexecute_path = \"/x\"\nidempotency_header = \"Bad Header\"\n";
    let err = Config::from_toml(bad, "test", std::iter::empty())
        .expect_err("a bad header")
        .to_string();
    assert!(err.contains("providers.bank.idempotency_header"), "{err}");
    Ok(())
}

/// A listener whose accept queue is full: further SYNs are dropped, so a connect hangs.
async fn black_hole() -> Result<(tokio::net::TcpListener, Vec<tokio::net::TcpStream>)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(1)?;
    let addr = listener.local_addr()?;
    let mut fillers = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(stream) => fillers.push(stream?),
            Err(_) => return Ok((listener, fillers)),
        }
    }
    anyhow::bail!("the accept queue never filled up")
}

#[tokio::test]
async fn a_connect_that_hangs_is_not_sent() -> Result {
    let (listener, _fillers) = black_hole().await?;
    let base = format!("http://{}", listener.local_addr()?);
    // Equal timeouts: whichever fires first, no connection was ever handed to the request.
    let p = bank(
        &base,
        &format!("{BOTH_LOOKUPS}connect_timeout = \"300ms\"\ntimeout = \"300ms\"\n"),
    )?;
    let k = key(40);
    let body = payload(json!({"amount": 40}));
    let outcome = p.execute(call(&k, &body)).await;
    assert!(
        matches!(&outcome, Outcome::NotSent { code } if code == "connect_timeout" || code == "connect_failed"),
        "expected NotSent, got {outcome:?}"
    );

    // The whole-call timeout fires while still connecting (a config validation forbids,
    // but an adapter built directly allows): still provably not sent.
    let text = format!("[providers.bank]\nbase_url = \"{base}\"\nexecute_path = \"/x\"\n");
    let ProviderConfig::Http(mut config) =
        Config::from_toml(&text, "test", std::iter::empty())?.providers["bank"].clone()
    else {
        anyhow::bail!("bank is an http provider");
    };
    config.connect_timeout = Duration::from_secs(30);
    config.timeout = Duration::from_millis(300);
    let direct = HttpProvider::new("bank", &config)?;
    assert_eq!(
        direct.execute(call(&k, &body)).await,
        Outcome::NotSent {
            code: "connect_timeout".into()
        }
    );
    Ok(())
}

/// The mapping: a body template reshapes the payload (the sandbox indexes the mapped
/// `business_reference`, so a lookup by it proves what was sent); a payload without a
/// field the template needs is rejected with nothing sent; configured status lists
/// decide what a status means.
#[tokio::test]
async fn a_body_template_reshapes_the_payload_and_a_missing_field_sends_nothing() -> Result {
    let sb = start().await?;
    let mapped = r#"
lookup_by_reference_path = "/v1/payment-orders?reference={reference}"
reference_pointer = "/order/ref"
retry_statuses = [408, 429, 503]
body = { business_reference = "{/order/ref}", amount = "{/amount_minor}", memo = "order {/order/ref} key {key}", meta = { lines = ["{/order/ref}", 1] } }
"#;
    let p = bank(&sb.base_url(), mapped)?;
    let k = key(40);
    let body = payload(json!({"order": {"ref": "ord-40"}, "amount_minor": 40}));
    succeeded_id(&p.execute(call(&k, &body)).await);
    assert!(
        matches!(p.lookup(call(&k, &body)).await, Remote::Succeeded { .. }),
        "found by the reference the template put in the body"
    );

    let k = key(41);
    let incomplete = payload(json!({"amount_minor": 41}));
    assert_eq!(
        p.execute(call(&k, &incomplete)).await,
        Outcome::Rejected {
            code: "template_missing_field".into()
        }
    );
    let stats = sb.control().stats().await?;
    assert_eq!(stats["executes"]["bank"], json!(1), "nothing sent: {stats}");

    // 503 listed in retry_statuses: not done, retry (the default would be unknown).
    let k = key(42);
    sb.set_faults(faults(vec![
        FaultRule::new(FaultMode::ErrorBeforeCommit).key(k.as_str()),
    ]))?;
    let body = payload(json!({"order": {"ref": "ord-42"}, "amount_minor": 42}));
    assert_eq!(
        p.execute(call(&k, &body)).await,
        Outcome::NotSent {
            code: "http_503".into()
        }
    );
    Ok(())
}
