//! Admin commands and outcome events, from the outside.

use oncely_core::journal::{ClaimOutcome, ClaimRequest, Completion, Verdict};
use oncely_core::{Intent, Status};
use oncely_tests::eventually;
use oncely_tests::fleet::{Fleet, FleetOptions, next_outcome, secret};
use serde_json::{Value, json};
use std::time::Duration;

fn email(n: usize, subject: &str) -> Intent {
    Intent::from_json(json!({"action_type": "email.send", "workflow_id": "case-admin", "step": "notify",
        "business_object": format!("object-{n}"), "revision": 1, "payload": {"to": "a@example.test", "subject": subject}}))
    .expect("intent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_list_filters_and_purge_respects_key_retention() {
    let fleet = Fleet::with(FleetOptions {
        key_retention: "1s".into(),
        ..FleetOptions::default()
    })
    .await;
    let j = fleet.db.journal();
    let done = email(1, "done").seal(&secret()).expect("seal");
    let live = email(2, "live").seal(&secret()).expect("seal");
    j.record(&done, "t").await.expect("record");
    j.record(&live, "t").await.expect("record");
    let ClaimOutcome::Claimed(c) = j
        .claim(
            &[ClaimRequest {
                envelope: &done,
                lease: Duration::from_secs(60),
            }],
            "t",
        )
        .await
        .expect("claim")
        .remove(0)
    else {
        panic!("claim")
    };
    let ok = Completion {
        key: done.key.clone(),
        expected: Status::Executing,
        attempt: c.attempt,
        verdict: Verdict::Succeeded {
            provider_operation_id: "em_1".into(),
            result: json!({}),
        },
        reason: "provider_succeeded".into(),
    };
    assert!(j.complete(&ok, "t").await.expect("complete"));

    let (code, out, _) = fleet.admin(&["ops", "list", "--status", "planned"]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains(live.key.as_str()) && !out.contains(done.key.as_str()),
        "{out}"
    );
    let (code, out, _) = fleet
        .admin(&["ops", "list", "--workflow", "case-admin", "--json"])
        .await;
    assert_eq!(code, 0);
    let listed: Vec<Value> = serde_json::from_str(&out).expect("json");
    assert_eq!(listed.len(), 2);
    let (code, _, err) = fleet.admin(&["ops", "list", "--status", "bogus"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("bogus"), "{err}");

    // Purge: a terminal operation goes once it is older than both the age and the key retention.
    let (code, out, _) = fleet
        .admin(&["purge", "--older-than", "1h", "--dry-run"])
        .await;
    assert_eq!((code, out.trim()), (0, "would purge 0 terminal operations"));
    eventually(
        "the operation to age past the retention (database clock)",
        Duration::from_secs(20),
        || async {
            let op = fleet.op(&done.key).await.expect("row");
            (op.read_at - op.updated_at > chrono::Duration::milliseconds(1200)).then_some(())
        },
    )
    .await;
    let (code, out, _) = fleet.admin(&["purge", "--older-than", "1s"]).await;
    assert_eq!((code, out.trim()), (0, "purged 1 terminal operations"));
    assert!(fleet.op(&done.key).await.is_none());
    assert!(j.events(&done.key).await.expect("events").is_empty());
    assert!(
        fleet.op(&live.key).await.is_some(),
        "live operations are never purged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_hear_outcomes_and_conflicts() {
    let fleet = Fleet::new().await;
    let mut consumer = fleet.listen_outcomes("email.send.*").await;
    let _w = fleet.worker();
    let first = email(1, "hello").seal(&secret()).expect("seal");
    let conflicting = email(1, "changed").seal(&secret()).expect("seal");
    fleet.publish_raw("email.send", &first.to_bytes()).await;
    let mut seen: Vec<(String, Value)> = Vec::new();
    seen.push(next_outcome(&mut consumer).await);
    fleet
        .publish_raw("email.send", &conflicting.to_bytes())
        .await;
    seen.push(next_outcome(&mut consumer).await);
    assert_eq!(seen[0].0, "email.send.succeeded");
    assert_eq!(seen[0].1["idempotency_key"], json!(first.key.as_str()));
    assert!(
        seen[0].1["provider_operation_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("em_"))
    );
    assert_eq!(seen[1].0, "email.send.conflict");
    assert!(
        seen.iter()
            .all(|(_, v)| v.get("payload").is_none() && !v.to_string().contains("a@example.test")),
        "no payload in outcomes"
    );
}
