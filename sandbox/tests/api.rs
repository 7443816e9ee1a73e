//! The provider contract without faults: replay, 422, 409, lookup, validation,
//! and the control endpoints that report on it.

// Tests unwrap: a failing unwrap is a failing test, with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::{eventually, execute, lookup, lookup_key, send, start};
use hyper::Method;
use oncely_sandbox::{FaultMode, FaultRule, Faults, Provider, Stats};
use serde_json::json;

#[tokio::test]
async fn replay_of_same_key_and_body_is_one_effect() {
    let sb = start().await;
    let ctl = sb.control();
    let body = json!({"to": "a@example.com", "business_reference": "inv-1"});
    let first = execute(&sb, Provider::Mail, "intent:1:mail", &body).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(
        first.body,
        json!({"id": "em_000001", "status": "succeeded",
               "idempotency_key": "intent:1:mail", "business_reference": "inv-1"})
    );
    // Same body with keys in another order is the same request.
    let reordered = json!({"business_reference": "inv-1", "to": "a@example.com"});
    let second = execute(&sb, Provider::Mail, "intent:1:mail", &reordered).await;
    assert_eq!(second.status, 201);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(ctl.effect_count("intent:1:mail").await.unwrap(), 1);
    let stats: Stats = serde_json::from_value(ctl.stats().await.unwrap()).unwrap();
    assert_eq!((stats.executes.mail, stats.replays), (2, 1));
    sb.shutdown().await;
}

#[tokio::test]
async fn same_key_with_another_body_is_422_without_effect() {
    let sb = start().await;
    let first = execute(&sb, Provider::Bank, "k", &json!({"amount": 100})).await;
    assert_eq!(first.status, 201);
    let other = execute(&sb, Provider::Bank, "k", &json!({"amount": 200})).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.body, json!({"error": "idempotency_key_reused"}));
    assert_eq!(sb.control().effect_count("k").await.unwrap(), 1);
    // The same key at another provider is another store.
    let mail = execute(&sb, Provider::Mail, "k", &json!({"amount": 200})).await;
    assert_eq!(
        (mail.status, mail.body["id"].as_str()),
        (201, Some("em_000001"))
    );
    sb.shutdown().await;
}

#[tokio::test]
async fn key_in_flight_is_409() {
    let sb = start().await;
    sb.set_faults(Faults {
        rules: vec![
            FaultRule::new(FaultMode::Latency)
                .key("slow")
                .latency_ms(1_000),
        ],
        ..Faults::default()
    })
    .unwrap();
    let body = json!({"title": "disk full"});
    let first = {
        let sb_addr = sb.addr();
        let body = body.clone();
        tokio::spawn(async move {
            let path = Provider::Tickets.path();
            send(
                sb_addr,
                Method::POST,
                &path,
                &[("idempotency-key", "slow")],
                Some(&body.to_string()),
            )
            .await
            .unwrap()
        })
    };
    let pending = eventually("the first request to be in flight", || async {
        let r = lookup_key(&sb, Provider::Tickets, "slow").await;
        (r.status == 200).then_some(r.body)
    })
    .await;
    assert_eq!(
        pending,
        json!({"id": null, "status": "pending", "idempotency_key": "slow", "business_reference": null})
    );
    let second = execute(&sb, Provider::Tickets, "slow", &body).await;
    assert_eq!(second.status, 409);
    assert_eq!(second.body, json!({"error": "request_in_progress"}));
    let first = first.await.unwrap();
    assert_eq!(
        (first.status, first.body["id"].as_str()),
        (201, Some("tk_000001"))
    );
    let third = execute(&sb, Provider::Tickets, "slow", &body).await;
    assert!(third.status == 201 && third.replayed());
    assert_eq!(sb.effects().count("slow"), 1);
    let stats: Stats = serde_json::from_value(sb.control().stats().await.unwrap()).unwrap();
    assert_eq!((stats.in_flight_409, stats.faults.latency), (1, 1));
    sb.shutdown().await;
}

#[tokio::test]
async fn lookup_by_key_and_by_reference() {
    let sb = start().await;
    let a = execute(
        &sb,
        Provider::Bank,
        "a:1",
        &json!({"business_reference": "order-7"}),
    )
    .await;
    let b = execute(
        &sb,
        Provider::Bank,
        "a:2",
        &json!({"business_reference": "order-7"}),
    )
    .await;
    assert_eq!((a.status, b.status), (201, 201));

    let by_key = lookup_key(&sb, Provider::Bank, "a:1").await;
    assert_eq!(by_key.status, 200);
    assert_eq!(
        by_key.body,
        json!({"id": "po_000001", "status": "succeeded", "idempotency_key": "a:1",
               "business_reference": "order-7"})
    );
    // Several records with one reference: the newest.
    let by_ref = lookup(&sb, Provider::Bank, "reference=order-7").await;
    assert_eq!(
        (by_ref.status, &by_ref.body["id"]),
        (200, &json!("po_000002"))
    );

    let missing = lookup_key(&sb, Provider::Bank, "a:3").await;
    assert_eq!(
        (missing.status, missing.body.clone()),
        (404, json!({"error": "not_found"}))
    );
    assert_eq!(
        lookup(&sb, Provider::Bank, "reference=nope").await.status,
        404
    );
    // Other providers do not see bank records.
    assert_eq!(lookup_key(&sb, Provider::Mail, "a:1").await.status, 404);
    // Exactly one selector.
    assert_eq!(lookup(&sb, Provider::Bank, "").await.status, 400);
    sb.shutdown().await;
}

#[tokio::test]
async fn bad_requests_are_400_without_effect() {
    let sb = start().await;
    let path = Provider::Bank.path();
    let no_key = send(sb.addr(), Method::POST, &path, &[], Some("{}"))
        .await
        .unwrap();
    assert_eq!(
        (no_key.status, no_key.body),
        (400, json!({"error": "missing_idempotency_key"}))
    );
    for body in ["not json", "[1,2]", "\"s\"", ""] {
        let r = send(
            sb.addr(),
            Method::POST,
            &path,
            &[("idempotency-key", "k")],
            Some(body),
        )
        .await
        .unwrap();
        assert_eq!(
            (r.status, &r.body["error"]),
            (400, &json!("invalid_json")),
            "{body:?}"
        );
    }
    let r = execute(&sb, Provider::Bank, "k", &json!({"business_reference": 5})).await;
    assert_eq!(r.status, 400);
    let unknown = send(
        sb.addr(),
        Method::POST,
        "/v1/refunds",
        &[("idempotency-key", "k")],
        Some("{}"),
    )
    .await
    .unwrap();
    assert_eq!(unknown.status, 404);
    assert_eq!(sb.effects().total, 0);
    // The key was never stored: a valid request with it now executes.
    assert_eq!(
        execute(&sb, Provider::Bank, "k", &json!({})).await.status,
        201
    );
    sb.shutdown().await;
}

#[tokio::test]
async fn control_effects_stats_reset_and_health() {
    let sb = start().await;
    let ctl = sb.control();
    ctl.healthy().await.unwrap();
    let health = send(sb.addr(), Method::GET, "/healthz", &[], None)
        .await
        .unwrap();
    assert_eq!((health.status, health.body), (200, json!("ok")));

    execute(&sb, Provider::Mail, "m:1", &json!({})).await;
    execute(&sb, Provider::Bank, "b:1", &json!({})).await;
    execute(&sb, Provider::Bank, "b:1", &json!({})).await;
    let effects = ctl.effects().await.unwrap();
    assert_eq!(effects.total, 2);
    let raw = send(sb.addr(), Method::GET, "/control/effects", &[], None)
        .await
        .unwrap();
    assert_eq!(
        raw.body,
        json!({"total": 2, "keys": {"m:1": {"provider": "mail", "count": 1},
                                    "b:1": {"provider": "bank", "count": 1}}})
    );
    let one = send(
        sb.addr(),
        Method::GET,
        "/control/effects?key=b%3A1",
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(one.body, json!({"key": "b:1", "count": 1}));
    assert_eq!(ctl.effect_count("never").await.unwrap(), 0);
    assert_eq!(
        ctl.stats().await.unwrap(),
        json!({"executes": {"mail": 1, "tickets": 0, "bank": 2}, "lookups": 0, "replays": 1,
               "conflicts_422": 0, "in_flight_409": 0, "unauthorized_401": 0, "rate_limited_429": 0,
               "faults": {"accept_then_timeout": 0, "accept_then_reset": 0,
                          "error_before_commit": 0, "reject": 0, "latency": 0,
                          "lookup_disabled": 0, "tls_dropped": 0, "tls_stalled": 0}})
    );

    ctl.set_faults(&Faults {
        seed: 3,
        ..Faults::default()
    })
    .await
    .unwrap();
    ctl.reset().await.unwrap();
    assert_eq!(ctl.effects().await.unwrap().total, 0);
    assert_eq!(ctl.faults().await.unwrap(), Faults::default());
    let stats: Stats = serde_json::from_value(ctl.stats().await.unwrap()).unwrap();
    assert_eq!(stats, Stats::default());
    assert_eq!(lookup_key(&sb, Provider::Bank, "b:1").await.status, 404);
    // Ids restart too.
    let again = execute(&sb, Provider::Bank, "b:1", &json!({})).await;
    assert_eq!(
        (again.status, &again.body["id"]),
        (201, &json!("po_000001"))
    );
    sb.shutdown().await;
}
