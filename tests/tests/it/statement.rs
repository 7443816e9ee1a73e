//! `oncely-worker admin import-statement`, the real binary against a real journal:
//! a generated bank statement settles 100 unknown payment orders, flags 2 unexpected
//! effects, changes nothing when imported again, and bad rows block the import.

use oncely_core::journal::{ClaimOutcome, ClaimRequest, Completion, Journal, NewReview, Verdict};
use oncely_core::review::ReviewReason;
use oncely_core::{Envelope, Intent, Status};
use oncely_tests::fleet::{Fleet, secret};
use serde_json::{Value, json};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);

fn order(n: usize) -> Envelope {
    Intent::from_json(json!({
        "action_type": "payment_order.create", "workflow_id": "statement", "step": "pay",
        "business_object": format!("invoice-{n}"), "revision": 1,
        "payload": {"account_id": "acc-1", "amount_minor": 100 + n, "currency": "EUR",
                    "business_reference": format!("inv-{n}")}
    }))
    .expect("intent")
    .seal(&secret())
    .expect("seal")
}

/// Claims `envelopes` and completes each as `verdict(i)`.
async fn drive(j: &Journal, envelopes: &[Envelope], verdict: impl Fn(usize) -> Verdict) {
    let requests: Vec<ClaimRequest<'_>> = envelopes
        .iter()
        .map(|envelope| ClaimRequest {
            envelope,
            lease: LEASE,
        })
        .collect();
    let claims = j.claim(&requests, "w1").await.expect("claim");
    let completions: Vec<Completion> = claims
        .iter()
        .zip(envelopes)
        .enumerate()
        .map(|(i, (claim, e))| {
            let ClaimOutcome::Claimed(c) = claim else {
                panic!("not claimed: {claim:?}")
            };
            Completion {
                key: e.key.clone(),
                expected: Status::Executing,
                attempt: c.attempt,
                verdict: verdict(i),
                reason: "test".into(),
            }
        })
        .collect();
    for ok in j.complete_many(&completions, "w1").await.expect("complete") {
        assert!(ok, "completed");
    }
}

fn unknown() -> Verdict {
    Verdict::Unknown {
        error_code: "timeout".into(),
        check_in: Duration::from_secs(3600),
    }
}

async fn statuses(fleet: &Fleet) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT status, count(*) FROM agent_operations GROUP BY 1 ORDER BY 1")
        .fetch_all(&fleet.db.pool)
        .await
        .expect("statuses")
}

async fn import(fleet: &Fleet, file: &std::path::Path, extra: &[&str]) -> (i32, Value) {
    let path = file.to_string_lossy();
    let mut args = vec![
        "import-statement",
        &path,
        "--provider",
        "bank",
        "--format",
        "csv",
        "--json",
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = fleet.admin(&args).await;
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout} {stderr}"));
    (code, report)
}

/// Settlement events by `actor` (not the `review_closed` events that go with some).
async fn events_by(fleet: &Fleet, actor: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM operation_events WHERE actor = $1 AND reason <> 'review_closed'",
    )
    .bind(actor)
    .fetch_one(&fleet.db.pool)
    .await
    .expect("events")
}

fn count(report: &Value, field: &str) -> usize {
    report[field].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_settles_unknowns_flags_unexpected_effects_and_is_idempotent() {
    let fleet = Fleet::new().await;
    let j = fleet.db.journal();
    // 102 unknown payment orders (10 with an open review), 2 settled ones.
    let unknowns: Vec<Envelope> = (0..102).map(order).collect();
    drive(&j, &unknowns, |_| unknown()).await;
    // Half for a person, half still re-checked (lookups failing, next one far off): a
    // statement closes both kinds.
    let (unsupported, failing) = (
        ReviewReason::LookupUnsupported,
        ReviewReason::LookupFailing("http_503".into()),
    );
    let transient = NewReview {
        recheck_in: Some(Duration::from_secs(3600)),
        lookup: Some(("failed", Some("http_503"))),
        ..NewReview::bare(&failing)
    };
    for (i, e) in unknowns[..10].iter().enumerate() {
        let review = if i % 2 == 0 {
            NewReview::bare(&unsupported)
        } else {
            transient.clone()
        };
        assert!(
            j.open_review(&e.key, 1, &review, "test")
                .await
                .expect("review")
        );
    }
    let settled: Vec<Envelope> = (200..202).map(order).collect();
    drive(&j, &settled, |i| Verdict::Succeeded {
        provider_operation_id: format!("po_settled_{i}"),
        result: json!({}),
    })
    .await;
    // One still executing (claimed, no answer yet), named in the statement by reference.
    let in_flight = order(300);
    j.claim(
        &[ClaimRequest {
            envelope: &in_flight,
            lease: LEASE,
        }],
        "w2",
    )
    .await
    .expect("claim");

    // The statement: 98 succeeded by key, 1 succeeded by reference only, 1 failed; the
    // first settled order as the journal has it, the second with another id (conflict);
    // two keys oncely never recorded. Orders 100 and 101 are not in it.
    let mut csv = String::from("id,idempotency_key,business_reference,status,amount\n");
    for (i, e) in unknowns[..98].iter().enumerate() {
        csv.push_str(&format!("po_{i},{},inv-{i},succeeded,{}\n", e.key, 100 + i));
    }
    csv.push_str("po_98,,inv-98,succeeded,198\n");
    csv.push_str(&format!("po_99,{},inv-99,failed,199\n", unknowns[99].key));
    csv.push_str(&format!(
        "po_settled_0,{},inv-200,succeeded,300\n",
        settled[0].key
    ));
    csv.push_str(&format!(
        "po_other,{},inv-201,succeeded,301\n",
        settled[1].key
    ));
    csv.push_str("po_300,,inv-300,succeeded,400\n");
    let strangers = [order(900).key, order(901).key];
    for (i, k) in strangers.iter().enumerate() {
        csv.push_str(&format!("po_stranger_{i},{k},,succeeded,1\n"));
    }
    let file = fleet.dir.join("bank-2026-12-03.csv");
    std::fs::write(&file, &csv).expect("statement");

    // Dry run: the report, nothing written.
    let before = statuses(&fleet).await;
    let (code, report) = import(&fleet, &file, &[]).await;
    assert_eq!(code, 2, "unexpected effects are an alarm: {report}");
    assert_eq!(report["applied"], json!(false));
    assert_eq!(
        (
            count(&report, "settled_succeeded"),
            count(&report, "settled_failed")
        ),
        (99, 1)
    );
    assert_eq!(count(&report, "unexpected"), 2);
    assert_eq!(count(&report, "conflicts"), 1);
    assert_eq!(
        count(&report, "live"),
        1,
        "the executing order is left alone"
    );
    assert_eq!(report["already_settled"], json!(1));
    assert_eq!(count(&report, "missing"), 2);
    assert_eq!(statuses(&fleet).await, before, "a dry run writes nothing");

    // Applied.
    let (code, report) = import(&fleet, &file, &["--apply"]).await;
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["applied"], json!(true));
    assert_eq!(
        (
            count(&report, "settled_succeeded"),
            count(&report, "settled_failed")
        ),
        (99, 1)
    );
    assert_eq!(
        statuses(&fleet).await,
        vec![
            ("executing".into(), 1),
            ("failed_final".into(), 1),
            ("succeeded".into(), 101),
            ("unknown".into(), 2)
        ]
    );
    for (i, e) in unknowns[..99].iter().enumerate() {
        let op = fleet.op(&e.key).await.expect("row");
        assert_eq!(op.provider_operation_id, Some(format!("po_{i}")), "{i}");
    }
    let failed = fleet.op(&unknowns[99].key).await.expect("row");
    assert_eq!(failed.last_error_code.as_deref(), Some("statement_failed"));
    let actor = "statement:bank-2026-12-03.csv";
    assert_eq!(
        events_by(&fleet, actor).await,
        100,
        "one event per settlement"
    );
    let closed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM operation_reviews r WHERE resolved_by = $1 AND resolution = 'auto:statement' \
           AND EXISTS (SELECT 1 FROM operation_events e WHERE e.idempotency_key = r.idempotency_key \
                       AND e.reason = 'review_closed' AND e.error_code = 'auto:statement' AND e.actor = $1)",
    )
    .bind(actor)
    .fetch_one(&fleet.db.pool)
    .await
    .expect("reviews");
    assert_eq!(
        closed, 10,
        "the open reviews of settled orders closed themselves, each with an event"
    );
    let other = fleet.op(&settled[1].key).await.expect("row");
    assert_eq!(
        other.provider_operation_id.as_deref(),
        Some("po_settled_1"),
        "a conflict is not applied"
    );

    // The same file again: nothing changes.
    let (code, report) = import(&fleet, &file, &["--apply"]).await;
    assert_eq!(code, 2);
    assert_eq!(
        count(&report, "settled_succeeded") + count(&report, "settled_failed"),
        0
    );
    assert_eq!(report["already_settled"], json!(101));
    assert_eq!(events_by(&fleet, actor).await, 100);

    // Bad rows block the import (with their line numbers) unless --skip-bad.
    let bad = fleet.dir.join("bank-bad.csv");
    std::fs::write(
        &bad,
        format!(
            "id,idempotency_key,business_reference,status\npo_100,{},inv-100,succeeded\npo_x,v1:nothex,,succeeded\npo_101,{},inv-101,maybe\n",
            unknowns[100].key, unknowns[101].key
        ),
    )
    .expect("bad statement");
    let (code, report) = import(&fleet, &bad, &["--apply"]).await;
    assert_eq!(code, 1, "{report}");
    let lines: Vec<u64> = report["bad"]
        .as_array()
        .expect("bad")
        .iter()
        .filter_map(|b| b["line"].as_u64())
        .collect();
    assert_eq!(lines, vec![3, 4]);
    assert_eq!(
        fleet.op(&unknowns[100].key).await.expect("row").status,
        Status::Unknown
    );
    let (code, report) = import(&fleet, &bad, &["--apply", "--skip-bad"]).await;
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        fleet.op(&unknowns[100].key).await.expect("row").status,
        Status::Succeeded
    );
    assert_eq!(count(&report, "missing"), 1, "order 101 is still unknown");
}

/// JSON Lines with pointer fields (a payment provider's report), one row naming its
/// operation only by the reference in its metadata (no key at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jsonl_report_settles_by_key_pointer_and_by_reference_alone() {
    let fleet = Fleet::new().await;
    let j = fleet.db.journal();
    let orders: Vec<Envelope> = (0..2).map(order).collect();
    drive(&j, &orders, |_| unknown()).await;
    let file = fleet.dir.join("report.jsonl");
    let lines = [
        json!({"id": "pi_0", "status": "succeeded", "metadata": {"oncely_key": orders[0].key.as_str(), "ref": "inv-0"}}),
        json!({"id": "pi_1", "status": "succeeded", "metadata": {"ref": "inv-1"}}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, text).expect("report");
    let path = file.to_string_lossy();
    let args = [
        "import-statement",
        &path,
        "--provider",
        "bank",
        "--format",
        "jsonl",
        "--json",
        "--apply",
        "--key-field",
        "/metadata/oncely_key",
        "--reference-field",
        "/metadata/ref",
    ];
    let (code, stdout, stderr) = fleet.admin(&args).await;
    assert_eq!(code, 0, "{stdout} {stderr}");
    for (i, e) in orders.iter().enumerate() {
        let op = fleet.op(&e.key).await.expect("row");
        assert_eq!(op.status, Status::Succeeded, "{i}");
        assert_eq!(op.provider_operation_id, Some(format!("pi_{i}")));
    }
}
