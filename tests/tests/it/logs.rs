//! No payload in logs: every process of an end-to-end run (successes, conflicts, invalid
//! messages, unknowns, reconciliation, reviews), at debug level, is grepped for a marker
//! that only the payloads contain.

use oncely_core::{Intent, Status};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, secret};
use serde_json::json;
use std::time::Duration;

const MARKER: &str = "PAYLOAD-MARKER-5f1c9e";

fn intent(action: &str, n: usize, extra: &str) -> Intent {
    Intent::from_json(json!({"action_type": action, "workflow_id": "case-logs", "step": "s", "business_object": format!("o-{n}"),
        "revision": 1, "payload": {"note": format!("{MARKER} {extra}"), "business_reference": format!("{MARKER}-{n}")}}))
    .expect("intent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_payload_reaches_the_logs() {
    let fleet = Fleet::with(FleetOptions {
        timeout: "1s".into(),
        lease: "3s".into(),
        reconciler: Some(FAST_RECONCILER),
        max_reconcile_checks: Some(2),
        ..FleetOptions::default()
    })
    .await;
    let debug = [("RUST_LOG", "debug")];
    let worker = fleet.spawn_with_env(&["run"], &debug);
    let reconciler = fleet.spawn_with_env(&["reconcile"], &debug);
    let ok = intent("email.send", 1, "ok").seal(&secret()).expect("seal");
    let unknown = intent("payment_order.create", 2, "unknown")
        .seal(&secret())
        .expect("seal");
    let conflict = intent("email.send", 1, "changed")
        .seal(&secret())
        .expect("seal");
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"lookup_disabled": ["bank"], "rules": [{"provider": "bank", "mode": "accept_then_timeout", "key": unknown.key.as_str(), "hold_ms": 30000}]}))
        .await
        .expect("faults");
    fleet.publish_raw("email.send", &ok.to_bytes()).await;
    fleet
        .publish_raw("payment_order.create", &unknown.to_bytes())
        .await;
    let mut forged = ok.to_json();
    forged["revision"] = json!(5);
    fleet
        .publish_raw("email.send", &serde_json::to_vec(&forged).expect("json"))
        .await;
    fleet
        .publish_raw(
            "email.send",
            format!("{{\"broken\": \"{MARKER}\"").as_bytes(),
        )
        .await;
    eventually("the first email", Duration::from_secs(60), || async {
        fleet
            .op(&ok.key)
            .await
            .filter(|o| o.status == Status::Succeeded)
    })
    .await;
    fleet.publish_raw("email.send", &conflict.to_bytes()).await;
    eventually(
        "the payment to reach review",
        Duration::from_secs(60),
        || async {
            let r = fleet
                .db
                .journal()
                .reviews_of(&unknown.key)
                .await
                .expect("reviews");
            (!r.is_empty()).then_some(())
        },
    )
    .await;
    eventually(
        "the conflict to be recorded",
        Duration::from_secs(60),
        || async {
            let ev = fleet.db.journal().events(&ok.key).await.expect("events");
            ev.iter().any(|e| e.reason == "conflict").then_some(())
        },
    )
    .await;
    let dead = fleet.topology().dead_queue();
    eventually(
        "both invalid messages dead-lettered",
        Duration::from_secs(60),
        || async { (fleet.ready(&dead).await == 2).then_some(()) },
    )
    .await;
    let logs = format!("{}\n{}", worker.logs(), reconciler.logs());
    assert!(logs.lines().count() > 10, "the processes logged: {logs}");
    assert!(logs.contains(ok.key.as_str()), "logs carry keys");
    assert!(
        !logs.contains(MARKER),
        "a payload reached the logs:\n{}",
        logs.lines()
            .filter(|l| l.contains(MARKER))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !logs.contains(oncely_tests::fleet::SECRET),
        "the key secret reached the logs"
    );
}
