//! Key rotation and sealed payloads, against real processes, Postgres and RabbitMQ:
//! an intent repeated across a rotation of the key secret is a duplicate (SDK, gateway
//! and a raw AMQP envelope), payloads never reach the database, logs or metrics in plain
//! text, and a payload sealed with a key nobody holds sends its operation to a person.

use oncely_core::journal::ClaimRequest;
use oncely_core::{DataKeys, Intent, KeyRing};
use oncely_producer::{Enqueued, Producer};
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, SECRET, secret};
use oncely_tests::gateway::{Gateway, TOKEN_A};
use oncely_tests::{eventually, free_port, http_get};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
const NEW_SECRET: &str = "the-new-secret-of-this-test";
const DK_OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const DK_NEW: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// The ring after a rotation: the new secret current, the fleet's old one verify-only.
fn rotated_ring(dir: &Path) -> PathBuf {
    write(
        dir,
        "ring-rotated.toml",
        &format!(
            "[[secret]]\nid = \"2026-12\"\nstate = \"current\"\nvalue = \"{NEW_SECRET}\"\n\n\
             [[secret]]\nid = \"2026-06\"\nstate = \"verify-only\"\nvalue = \"{SECRET}\"\n"
        ),
    )
}

fn ticket(n: usize) -> Intent {
    Intent::from_json(json!({
        "action_type": "ticket.create", "tenant": "acme", "workflow_id": format!("case-{n}"),
        "step": "open", "business_object": format!("obj-{n}"), "revision": 1,
        "payload": {"title": format!("ticket {n}")}
    }))
    .expect("intent")
}

fn gateway_body(n: usize) -> serde_json::Value {
    json!({"workflow_id": format!("case-{n}"), "step": "open", "business_object": format!("obj-{n}"),
           "revision": 1, "payload": {"title": format!("ticket {n}")}})
}

/// Enqueue under secret A; rotate to B (A verify-only); the same intents again through
/// the SDK, the gateway and raw AMQP envelopes keyed with B → duplicates of the rows
/// recorded under A, one effect each, no row under a B key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_secret_never_executes_an_intent_twice() {
    let fleet = Fleet::new().await;
    let ring = rotated_ring(&fleet.dir);
    let ring_env = [
        ("ONCELY_KEY_SECRETS_FILE", ring.to_str().expect("path")),
        ("ONCELY_KEY_SECRET", ""),
    ];
    let old = secret();
    let new =
        KeyRing::parse_ring(&std::fs::read_to_string(&ring).expect("ring"), &ring).expect("ring");

    // Before the rotation: X0..X4 executed, Y0..Y4 recorded and queued, not yet executed.
    let before = fleet.producer().await;
    let xs: Vec<Intent> = (0..5).map(ticket).collect();
    let ys: Vec<Intent> = (5..10).map(ticket).collect();
    let mut old_worker = fleet.worker();
    for r in before.enqueue_many(xs.clone()).await.expect("enqueue") {
        assert!(matches!(r.expect("x"), Enqueued::Enqueued { .. }));
    }
    eventually("X executed under the old secret", DEADLINE, || async {
        (fleet.count("succeeded").await == 5).then_some(())
    })
    .await;
    old_worker.child.kill().await.expect("kill");
    for r in before.enqueue_many(ys.clone()).await.expect("enqueue") {
        assert!(matches!(r.expect("y"), Enqueued::Enqueued { .. }));
    }
    let all: Vec<Intent> = xs.iter().chain(&ys).cloned().collect();
    let old_keys: Vec<String> = all
        .iter()
        .map(|i| old.key_for(&i.identity).to_string())
        .collect();
    for (i, k) in all.iter().zip(&old_keys) {
        assert_ne!(
            &new.key_for(&i.identity).to_string(),
            k,
            "the secret changed"
        );
    }

    // After the rotation, through the SDK: duplicates, reported under the rows' keys.
    let after = Producer::connect(&fleet.config, new.clone())
        .await
        .expect("producer");
    let again = after.enqueue_many(all.clone()).await.expect("enqueue");
    for (r, k) in again.into_iter().zip(&old_keys) {
        match r.expect("enqueue") {
            Enqueued::Duplicate { key, .. } => assert_eq!(&key.to_string(), k),
            other => panic!("expected a duplicate, got {other:?}"),
        }
    }
    // Through the gateway (which holds the rotated ring): 200, the row's key.
    let gw = Gateway::start_with_env(&fleet, &[TOKEN_A], &ring_env).await;
    let mut client = gw.client(TOKEN_A.token).await;
    for (n, k) in (0..10).zip(&old_keys) {
        let r = client.submit("ticket.create", &gateway_body(n)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body["key"].as_str(), Some(k.as_str()), "{}", r.body);
    }
    // Raw envelopes keyed with the new secret (an agent publishing without the journal).
    for i in [&all[0], &all[5], &all[6]] {
        let env = i.clone().seal(&new).expect("seal");
        fleet.publish_raw("ticket.create", &env.to_bytes()).await;
    }

    let _worker = fleet.spawn_with_env(&["run"], &ring_env);
    eventually("every intent executed", DEADLINE, || async {
        (fleet.count("succeeded").await == 10).then_some(())
    })
    .await;
    let queue = fleet.topology().action_queue("ticket.create");
    eventually("the queue is drained", DEADLINE, || async {
        (fleet.ready(&queue).await == 0).then_some(())
    })
    .await;
    let effects = fleet.sandbox.effects();
    for k in &old_keys {
        assert_eq!(effects.count(k), 1, "{k}: one effect, under the first key");
    }
    assert_eq!(effects.total, 10, "no effect under a new key");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(&fleet.db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 10, "one row per intent");
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM operation_events WHERE reason LIKE 'conflict%'")
            .fetch_one(&fleet.db.pool)
            .await
            .expect("count");
    assert_eq!(dead, 0, "no conflict recorded");
    assert_eq!(
        fleet.ready(&fleet.topology().dead_queue()).await,
        0,
        "nothing dead-lettered"
    );
}

/// A ring file with two current secrets, or none, stops a process at start with the
/// entry named; so does a data-key file without a current key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_key_rings_and_data_key_files_stop_a_process_at_start() {
    let fleet = Fleet::new().await;
    let two = write(
        &fleet.dir,
        "two.toml",
        "[[secret]]\nid = \"a\"\nstate = \"current\"\nvalue = \"x\"\n\
         [[secret]]\nid = \"b\"\nstate = \"current\"\nvalue = \"y\"\n",
    );
    let none = write(
        &fleet.dir,
        "none.toml",
        "[[secret]]\nid = \"a\"\nstate = \"verify-only\"\nvalue = \"x\"\n",
    );
    let keys = write(
        &fleet.dir,
        "keys.toml",
        &format!("[[key]]\nid = \"k\"\nstate = \"decrypt-only\"\nhex = \"{DK_OLD}\"\n"),
    );
    let cases: [(&str, &Path, &str); 3] = [
        ("ONCELY_KEY_SECRETS_FILE", &two, "two secrets are `current`"),
        ("ONCELY_KEY_SECRETS_FILE", &none, "no secret is `current`"),
        ("ONCELY_DATA_KEYS_FILE", &keys, "no key is `current`"),
    ];
    for (var, file, expected) in cases {
        let mut p = fleet.spawn_with_env(
            &["run"],
            &[
                (var, file.to_str().expect("path")),
                (
                    "ONCELY_KEY_SECRET",
                    if var == "ONCELY_DATA_KEYS_FILE" {
                        SECRET
                    } else {
                        ""
                    },
                ),
            ],
        );
        let status = tokio::time::timeout(DEADLINE, p.child.wait())
            .await
            .expect("exits")
            .expect("status");
        assert!(!status.success());
        let logs = p.logs();
        assert!(logs.contains(expected), "{expected}: {logs}");
    }
}

fn data_keys_file(dir: &Path, name: &str, entries: &[(&str, &str, &str)]) -> PathBuf {
    let text: String = entries
        .iter()
        .map(|(id, state, hex)| {
            format!("[[key]]\nid = \"{id}\"\nstate = \"{state}\"\nhex = \"{hex}\"\n\n")
        })
        .collect();
    write(dir, name, &text)
}

fn pg_dump(url: &str) -> String {
    let out = std::process::Command::new("pg_dump")
        .args(["--data-only", "--dbname", url])
        .output()
        .expect("pg_dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A marker in the payloads of live operations (recorded by the SDK and by the gateway)
/// is not in a dump of the database; a payload recorded without data keys is (the grep
/// can see plain text); after execution the marker is in no log and no metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_payloads_never_reach_the_database_logs_or_metrics() {
    let fleet = Fleet::new().await;
    let keys_path = data_keys_file(&fleet.dir, "data-keys.toml", &[("dk-1", "current", DK_OLD)]);
    let keys_env = [("ONCELY_DATA_KEYS_FILE", keys_path.to_str().expect("path"))];
    let keys = DataKeys::load(&keys_path).expect("keys");
    let marker = "marker-5d1c9e@private.example";
    let intent = |n: usize| {
        Intent::from_json(json!({
            "action_type": "email.send", "tenant": "acme", "workflow_id": format!("wf-{n}"), "step": "notify",
            "business_object": format!("obj-{n}"), "revision": 1,
            "payload": {"to": marker, "subject": "Approved", "body": format!("{marker} #{n}")}
        }))
        .expect("intent")
    };
    let sdk = Producer::connect_with_data_keys(&fleet.config, secret(), Some(keys))
        .await
        .expect("producer");
    for r in sdk
        .enqueue_many((0..5).map(intent).collect())
        .await
        .expect("enqueue")
    {
        assert!(matches!(r.expect("enqueue"), Enqueued::Enqueued { .. }));
    }
    let gw = Gateway::start_with_env(&fleet, &[TOKEN_A], &keys_env).await;
    let mut client = gw.client(TOKEN_A.token).await;
    for n in 5..8 {
        let body = json!({"workflow_id": format!("wf-{n}"), "step": "notify", "business_object": format!("obj-{n}"),
                          "revision": 1, "payload": {"to": marker, "subject": "Approved", "body": format!("{marker} #{n}")}});
        let r = client.submit("email.send", &body).await;
        assert_eq!(r.status, 202, "{}", r.body);
    }
    let sealed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_operations WHERE payload_sealed IS NOT NULL AND payload IS NULL AND payload_key_id = 'dk-1'",
    )
    .fetch_one(&fleet.db.pool)
    .await
    .expect("count");
    assert_eq!(sealed, 8, "every live payload is sealed");
    let dump = pg_dump(&fleet.db.url);
    assert!(dump.contains("wf-7"), "the dump holds the rows");
    assert!(!dump.contains(marker), "the marker is not in the dump");
    assert!(!dump.contains("marker-5d1c9e"), "nor any part of it");

    // Executed by a worker holding the keys; its metrics and every log are clean.
    let mport = free_port();
    let mut worker = fleet.spawn_with_env(
        &["run", "--metrics-addr", &format!("127.0.0.1:{mport}")],
        &[keys_env[0], ("RUST_LOG", "debug")],
    );
    eventually("all executed", DEADLINE, || async {
        (fleet.count("succeeded").await == 8).then_some(())
    })
    .await;
    let metrics = http_get(mport, "/metrics").await.expect("metrics");
    assert!(metrics.contains("oncely_"), "the metrics are there");
    assert!(!metrics.contains("marker-5d1c9e"));
    for log in [worker.logs(), gw.proc.logs()] {
        assert!(!log.is_empty());
        assert!(!log.contains("marker-5d1c9e"), "{log}");
    }
    // The provider got the opened payload (the sandbox saw the real address).
    assert_eq!(fleet.sandbox.effects().total, 8);

    // The control: a payload recorded without data keys (and not executed: no worker
    // runs) is visible to the same grep.
    worker.child.kill().await.expect("kill");
    let plain = Producer::connect_with_data_keys(&fleet.config, secret(), None)
        .await
        .expect("producer");
    let mut control = intent(99);
    control
        .payload
        .insert("body".into(), json!("control-plain-4b1e"));
    plain.enqueue(control).await.expect("enqueue");
    assert!(pg_dump(&fleet.db.url).contains("control-plain-4b1e"));
}

/// Payloads sealed with a data key that was rotated out too early: the reconciler opens
/// a review with reason `payload_key_unknown` and keeps settling the others; a row sealed
/// with the old key still opens where the old key is kept decrypt-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_sealed_with_an_unknown_data_key_goes_to_review() {
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let old_only = data_keys_file(&fleet.dir, "old.toml", &[("dk-old", "current", DK_OLD)]);
    let new_only = data_keys_file(&fleet.dir, "new.toml", &[("dk-new", "current", DK_NEW)]);
    let seal_with = |path: &Path| {
        fleet
            .db
            .journal()
            .with_data_keys(Some(DataKeys::load(path).expect("keys")))
    };
    let ring = secret();
    let lost = ticket(1).seal(&ring).expect("seal");
    let fine = ticket(2).seal(&ring).expect("seal");
    // Claimed with a one-second lease and never executed: the sweeper makes both unknown.
    for (journal, env) in [(seal_with(&old_only), &lost), (seal_with(&new_only), &fine)] {
        let claimed = journal
            .claim(
                &[ClaimRequest {
                    envelope: env,
                    lease: Duration::from_secs(1),
                }],
                "test",
            )
            .await
            .expect("claim");
        assert!(matches!(
            claimed[0],
            oncely_core::journal::ClaimOutcome::Claimed(_)
        ));
    }
    let mut reconciler = fleet.spawn_with_env(
        &["reconcile"],
        &[("ONCELY_DATA_KEYS_FILE", new_only.to_str().expect("path"))],
    );
    let reason = eventually("a review for the unreadable payload", DEADLINE, || async {
        sqlx::query_scalar::<_, String>(
            "SELECT reason FROM operation_reviews WHERE idempotency_key = $1",
        )
        .bind(lost.key.as_str())
        .fetch_optional(&fleet.db.pool)
        .await
        .expect("review")
    })
    .await;
    assert_eq!(reason, "payload_key_unknown");
    eventually("the other unknown was asked about", DEADLINE, || async {
        let op = fleet.op(&fine.key).await.expect("op");
        (op.reconcile_checks > 0 || op.status != oncely_core::Status::Unknown).then_some(())
    })
    .await;
    assert!(
        reconciler.child.try_wait().expect("wait").is_none(),
        "the reconciler runs on"
    );
    assert!(
        reconciler.logs().contains("dk-old"),
        "the log names the missing key"
    );
    let review: Option<String> =
        sqlx::query_scalar("SELECT reason FROM operation_reviews WHERE idempotency_key = $1")
            .bind(fine.key.as_str())
            .fetch_optional(&fleet.db.pool)
            .await
            .expect("review");
    assert_eq!(review, None, "no review for the payload that opens");
    // With the old key kept decrypt-only, the lost row's payload opens again.
    let both = data_keys_file(
        &fleet.dir,
        "both.toml",
        &[
            ("dk-new", "current", DK_NEW),
            ("dk-old", "decrypt-only", DK_OLD),
        ],
    );
    let op = fleet.op(&lost.key).await.expect("op");
    let opened = op
        .open_payload(Some(&DataKeys::load(&both).expect("keys")))
        .expect("opens");
    assert_eq!(opened, lost.intent.payload);
}
