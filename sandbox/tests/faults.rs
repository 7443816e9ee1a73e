//! Each fault mode, the rule filters, seeded determinism and config validation.

// Tests unwrap: a failing unwrap is a failing test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{eventually, execute, execute_raw, lookup_key, send, start};
use hyper::Method;
use oncely_sandbox::{FaultMode, FaultRule, Faults, Provider, Sandbox, Stats};
use serde_json::{Value, json};

fn rules(rules: Vec<FaultRule>) -> Faults {
    Faults {
        rules,
        ..Faults::default()
    }
}

async fn stats(sb: &Sandbox) -> Stats {
    serde_json::from_value(sb.control().stats().await.unwrap()).unwrap()
}

async fn wait_for_effects(sb: &Sandbox, key: &str, n: u64) {
    eventually(&format!("{n} effect(s) for {key}"), || async {
        (sb.effects().count(key) == n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn accept_then_timeout_commits_then_replays_the_saved_success() {
    let sb = start().await;
    sb.control()
        .set_faults(&rules(vec![
            FaultRule::new(FaultMode::AcceptThenTimeout)
                .provider(Provider::Bank)
                .times(1),
        ]))
        .await
        .unwrap();
    let body = json!({"amount": 5, "business_reference": "pay-1"});
    // The client gives up on its own timeout: the server never answers.
    let attempt = tokio::time::timeout(
        Duration::from_millis(300),
        execute_raw(&sb, Provider::Bank, "pay:1", &body),
    )
    .await;
    assert!(attempt.is_err(), "expected no answer, got {attempt:?}");
    wait_for_effects(&sb, "pay:1", 1).await;
    // The retry (while the first request is still held) gets the saved 201.
    let retry = execute(&sb, Provider::Bank, "pay:1", &body).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body["id"], "po_000001");
    assert_eq!(sb.effects().count("pay:1"), 1);
    assert_eq!(stats(&sb).await.faults.accept_then_timeout, 1);
    sb.shutdown().await;
}

#[tokio::test]
async fn accept_then_timeout_closes_without_answer_after_hold() {
    let sb = start().await;
    sb.set_faults(rules(vec![
        FaultRule::new(FaultMode::AcceptThenTimeout).hold_ms(50),
    ]))
    .unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        execute_raw(&sb, Provider::Mail, "m:hold", &json!({})),
    )
    .await
    .expect("the connection is closed after hold_ms");
    let err = r.expect_err("no response");
    assert!(err.is_incomplete_message(), "{err:?}");
    assert_eq!(sb.effects().count("m:hold"), 1);
    sb.shutdown().await;
}

fn is_connection_reset(err: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionReset;
        }
        source = e.source();
    }
    false
}

#[tokio::test]
async fn accept_then_reset_commits_and_drops_the_connection() {
    let sb = start().await;
    sb.set_faults(rules(vec![
        FaultRule::new(FaultMode::AcceptThenReset).key("tk:reset"),
    ]))
    .unwrap();
    let body = json!({"title": "x"});
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        execute_raw(&sb, Provider::Tickets, "tk:reset", &body),
    )
    .await
    .expect("the connection is dropped at once, not held");
    let err = r.expect_err("no response");
    assert!(is_connection_reset(&err), "expected an RST, got {err:?}");
    assert_eq!(sb.effects().count("tk:reset"), 1);
    // The rule keeps applying to fresh attempts, but they are replays now.
    let retry = execute(&sb, Provider::Tickets, "tk:reset", &body).await;
    assert!(retry.status == 201 && retry.replayed());
    assert_eq!(sb.effects().count("tk:reset"), 1);
    assert_eq!(stats(&sb).await.faults.accept_then_reset, 1);
    sb.shutdown().await;
}

#[tokio::test]
async fn error_before_commit_releases_the_key() {
    let sb = start().await;
    sb.set_faults(rules(vec![
        FaultRule::new(FaultMode::ErrorBeforeCommit).times(1),
    ]))
    .unwrap();
    let body = json!({"to": "b@example.com"});
    let first = execute(&sb, Provider::Mail, "m:1", &body).await;
    assert_eq!(
        (first.status, first.body),
        (503, json!({"error": "unavailable"}))
    );
    assert_eq!(sb.effects().count("m:1"), 0);
    assert_eq!(lookup_key(&sb, Provider::Mail, "m:1").await.status, 404);
    let retry = execute(&sb, Provider::Mail, "m:1", &body).await;
    assert!(retry.status == 201 && !retry.replayed());
    assert_eq!(sb.effects().count("m:1"), 1);

    sb.set_faults(rules(vec![
        FaultRule::new(FaultMode::ErrorBeforeCommit).status(500),
    ]))
    .unwrap();
    assert_eq!(execute(&sb, Provider::Mail, "m:2", &body).await.status, 500);
    sb.shutdown().await;
}

#[tokio::test]
async fn reject_is_stored_replayed_and_looked_up() {
    let sb = start().await;
    sb.set_faults(rules(vec![
        FaultRule::new(FaultMode::Reject).provider(Provider::Bank),
    ]))
    .unwrap();
    let body = json!({"amount": 1, "business_reference": "r-9"});
    let first = execute(&sb, Provider::Bank, "po:9", &body).await;
    assert_eq!(first.status, 422);
    assert_eq!(
        first.body,
        json!({"error": "rejected", "reason": "sandbox_fault"})
    );
    let replay = execute(&sb, Provider::Bank, "po:9", &body).await;
    assert!(replay.status == 422 && replay.replayed());
    assert_eq!(replay.body, first.body);
    let found = lookup_key(&sb, Provider::Bank, "po:9").await;
    assert_eq!(
        (found.status, &found.body["status"]),
        (200, &json!("rejected"))
    );
    assert_eq!(found.body["business_reference"], "r-9");
    assert_eq!(sb.effects().total, 0);
    // Other providers are not affected by a bank-only rule.
    assert_eq!(
        execute(&sb, Provider::Mail, "em:9", &body).await.status,
        201
    );
    sb.shutdown().await;
}

#[tokio::test]
async fn lookup_disabled_is_503_for_listed_providers_only() {
    let sb = start().await;
    execute(&sb, Provider::Bank, "b", &json!({})).await;
    execute(&sb, Provider::Mail, "m", &json!({})).await;
    sb.control()
        .set_faults(&Faults {
            lookup_disabled: vec![Provider::Bank],
            ..Faults::default()
        })
        .await
        .unwrap();
    let bank = lookup_key(&sb, Provider::Bank, "b").await;
    assert_eq!(
        (bank.status, bank.body),
        (503, json!({"error": "lookup_unavailable"}))
    );
    assert_eq!(lookup_key(&sb, Provider::Mail, "m").await.status, 200);
    // Executes still work (and replay) with lookups off.
    assert!(
        execute(&sb, Provider::Bank, "b", &json!({}))
            .await
            .replayed()
    );
    assert_eq!(stats(&sb).await.faults.lookup_disabled, 1);
    sb.shutdown().await;
}

#[tokio::test]
async fn forgotten_key_makes_a_second_effect() {
    let sb = start().await;
    sb.set_faults(Faults {
        forget_keys_after_ms: Some(50),
        ..Faults::default()
    })
    .unwrap();
    let body = json!({"amount": 3, "business_reference": "ref-f"});
    let first = execute(&sb, Provider::Bank, "f:1", &body).await;
    assert_eq!(first.status, 201);
    eventually("the record to be forgotten", || async {
        (lookup_key(&sb, Provider::Bank, "f:1").await.status == 404).then_some(())
    })
    .await;
    let by_ref = common::lookup(&sb, Provider::Bank, "reference=ref-f").await;
    assert_eq!(by_ref.status, 404);
    let again = execute(&sb, Provider::Bank, "f:1", &body).await;
    assert!(again.status == 201 && !again.replayed());
    assert_eq!(again.body["id"], "po_000002");
    // The duplicate the rest of oncely must avoid, visible in the ledger.
    assert_eq!(sb.control().effect_count("f:1").await.unwrap(), 2);
    assert_eq!(sb.effects().duplicates().count(), 1);
    sb.shutdown().await;
}

#[tokio::test]
async fn times_and_key_filters() {
    let sb = start().await;
    sb.set_faults(rules(vec![
        FaultRule::new(FaultMode::Reject).key("only-me"),
        FaultRule::new(FaultMode::ErrorBeforeCommit)
            .provider(Provider::Tickets)
            .times(2),
    ]))
    .unwrap();
    let body = json!({});
    assert_eq!(
        execute(&sb, Provider::Mail, "other", &body).await.status,
        201
    );
    assert_eq!(
        execute(&sb, Provider::Mail, "only-me", &body).await.status,
        422
    );
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(
                execute(&sb, Provider::Tickets, &format!("t{i}"), &body)
                    .await
                    .status,
            );
        }
        v
    };
    assert_eq!(statuses, vec![503, 503, 201, 201]);
    let s = stats(&sb).await;
    assert_eq!((s.faults.reject, s.faults.error_before_commit), (1, 2));
    sb.shutdown().await;
}

async fn fault_sequence(sb: &Sandbox, seed: u64) -> Vec<u16> {
    sb.control()
        .set_faults(&Faults {
            seed,
            rules: vec![
                FaultRule::new(FaultMode::Reject)
                    .provider(Provider::Bank)
                    .rate(0.3),
                FaultRule::new(FaultMode::ErrorBeforeCommit).rate(0.5),
            ],
            ..Faults::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    for i in 0..30 {
        let provider = Provider::ALL[i % 3];
        let r = execute(sb, provider, &format!("d:{seed}:{i}"), &json!({"i": i})).await;
        out.push(r.status);
    }
    out
}

#[tokio::test]
async fn same_seed_and_order_give_the_same_decisions() {
    let a = start().await;
    let b = start().await;
    let run_a = fault_sequence(&a, 42).await;
    let run_b = fault_sequence(&b, 42).await;
    assert_eq!(run_a, run_b);
    for status in [201, 422, 503] {
        assert!(run_a.contains(&status), "{status} missing from {run_a:?}");
    }
    // PUT re-seeds: after a reset the same config replays the same decisions.
    a.control().reset().await.unwrap();
    assert_eq!(fault_sequence(&a, 42).await, run_a);
    // Another seed, another sequence.
    b.control().reset().await.unwrap();
    assert_ne!(fault_sequence(&b, 7).await, run_a);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn bad_fault_config_is_400_naming_the_field() {
    let sb = start().await;
    let put = |body: Value| {
        let addr = sb.addr();
        async move {
            send(
                addr,
                Method::PUT,
                "/control/faults",
                &[],
                Some(&body.to_string()),
            )
            .await
            .unwrap()
        }
    };
    let r = put(json!({"rules": [{"mode": "reject", "rate": 1.5}]})).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"], "invalid_faults");
    assert_eq!(r.body["field"], "rules[0].rate");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("rules[0].rate")
    );
    for (body, field) in [
        (
            json!({"rules": [{"mode": "reject", "provider": "banks"}]}),
            "rules[0].provider",
        ),
        (json!({"rules": [{"mode": "nap"}]}), "rules[0].mode"),
        (json!({"rules": [{"rate": 0.5}]}), "rules[0].mode"),
        (json!({"seed": "x"}), "seed"),
        (
            json!({"lookup_disabled": ["bank", "post"]}),
            "lookup_disabled[1]",
        ),
        (json!({"forget_keys_after": 5}), "forget_keys_after"),
    ] {
        let r = put(body.clone()).await;
        assert_eq!((r.status, &r.body["field"]), (400, &json!(field)), "{body}");
    }
    let not_json = send(sb.addr(), Method::PUT, "/control/faults", &[], Some("{"))
        .await
        .unwrap();
    assert_eq!(
        (not_json.status, &not_json.body["error"]),
        (400, &json!("invalid_json"))
    );
    // The Rust client surfaces the message; nothing was installed.
    let err = sb
        .control()
        .set_faults(&rules(vec![FaultRule::new(FaultMode::Reject).rate(-0.1)]))
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("rules[0].rate"), "{err:#}");
    assert_eq!(sb.control().faults().await.unwrap(), Faults::default());
    sb.shutdown().await;
}

#[tokio::test]
async fn faults_get_returns_what_was_put_with_defaults() {
    let sb = start().await;
    let ctl = sb.control();
    ctl.set_faults_json(&json!({"seed": 42, "lookup_disabled": ["bank"],
        "rules": [{"provider": "bank", "mode": "accept_then_timeout", "rate": 0.3, "latency_ms": 50}],
        "rate_limits": [{"provider": "mail", "per_second": 50.0}]}))
        .await
        .unwrap();
    let raw = send(sb.addr(), Method::GET, "/control/faults", &[], None)
        .await
        .unwrap();
    assert_eq!(
        raw.body,
        json!({"seed": 42, "latency_ms": 0, "lookup_disabled": ["bank"], "forget_keys_after_ms": null,
               "rules": [{"provider": "bank", "mode": "accept_then_timeout", "rate": 0.3, "times": null,
                          "key": null, "latency_ms": 50, "status": 503, "hold_ms": 60000}],
               "tls_drop_rate": 0.0, "tls_stall_rate": 0.0,
               "rate_limits": [{"provider": "mail", "per_second": 50.0, "burst": 1, "retry_after_s": null}]})
    );
    let typed = ctl.faults().await.unwrap();
    assert_eq!(typed.rules[0].mode, FaultMode::AcceptThenTimeout);
    sb.shutdown().await;
}
