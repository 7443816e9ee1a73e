//! The dashboards and alerts are true: a real Prometheus scrapes a real worker, a real
//! reconciler and RabbitMQ's own exporter under a small load; then every Grafana panel's
//! expression must return series, every metric name in any panel or alert must be one
//! Prometheus actually scraped, and every alert rule must load and evaluate healthily.
//!
//! Needs `prometheus` (Debian package) and RabbitMQ's `rabbitmq_prometheus` plugin on
//! 127.0.0.1:15692 — `scripts/test` (the README's test command) installs / enables both.

use oncely_core::{Intent, Status};
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, secret};
use oncely_tests::{eventually, free_port, http_get};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn intent(action: &str, n: usize) -> Intent {
    Intent::from_json(json!({"action_type": action, "workflow_id": "case-dash", "step": "s", "business_object": format!("o-{n}"),
        "revision": 1, "payload": {"n": n, "business_reference": format!("ref-{n}")}}))
    .expect("intent")
}

fn panel_exprs() -> Vec<(String, String)> {
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{REPO}/dashboards/grafana/oncely.json"))
            .expect("dashboard"),
    )
    .expect("json");
    let mut out = Vec::new();
    fn walk(p: &Value, out: &mut Vec<(String, String)>) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((p["title"].as_str().unwrap_or("?").to_owned(), e.to_owned()));
            }
        }
        for q in p["panels"].as_array().into_iter().flatten() {
            walk(q, out);
        }
    }
    for p in d["panels"].as_array().expect("panels") {
        walk(p, &mut out);
    }
    out
}

fn alert_exprs() -> Vec<(String, String)> {
    // A tiny reader for the rules file: `- alert: Name` then `expr: …` (one line or a `|` block).
    let text = std::fs::read_to_string(format!("{REPO}/dashboards/prometheus/alerts.yml"))
        .expect("alerts");
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    let mut name = String::new();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(n) = t.strip_prefix("- alert:") {
            name = n.trim().to_owned();
        } else if let Some(e) = t.strip_prefix("expr:") {
            let e = e.trim();
            if e == "|" || e == ">" || e.is_empty() {
                let indent = line.len() - line.trim_start().len();
                let mut block = String::new();
                while let Some(next) = lines.peek() {
                    if !next.trim().is_empty() && next.len() - next.trim_start().len() <= indent {
                        break;
                    }
                    block.push_str(next.trim());
                    block.push(' ');
                    lines.next();
                }
                out.push((name.clone(), block.trim().to_owned()));
            } else {
                out.push((name.clone(), e.to_owned()));
            }
        }
    }
    out
}

fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &expr[i..];
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if boundary && (rest.starts_with("oncely_") || rest.starts_with("rabbitmq_")) {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            names.insert(rest[..end].to_owned());
            i += end;
        } else {
            i += 1;
        }
    }
    names
}

async fn query(port: u16, expr: &str) -> Result<Vec<Value>, String> {
    let mut q = String::new();
    for b in expr.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            q.push(b as char);
        } else {
            q.push_str(&format!("%{b:02X}"));
        }
    }
    let body = http_get(port, &format!("/api/v1/query?query={q}"))
        .await
        .ok_or("query failed (HTTP error)")?;
    let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    if v["status"] != "success" {
        return Err(v.to_string());
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_alert_refers_to_real_series() {
    assert!(
        std::process::Command::new("prometheus")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "`prometheus` is required (apt-get install prometheus; scripts/test does it)"
    );
    assert!(
        http_get(15692, "/metrics").await.is_some(),
        "RabbitMQ's prometheus plugin must listen on :15692 (rabbitmq-plugins enable rabbitmq_prometheus; scripts/test does it)"
    );

    let fleet = Fleet::with(FleetOptions {
        timeout: "1s".into(),
        lease: "3s".into(),
        reconciler: Some(FAST_RECONCILER),
        max_reconcile_checks: Some(1),
        ..FleetOptions::default()
    })
    .await;
    let (wport, rport, pport) = (free_port(), free_port(), free_port());
    let _worker = fleet.spawn(&["run", "--metrics-addr", &format!("127.0.0.1:{wport}")]);
    let _reconciler = fleet.spawn(&["reconcile", "--metrics-addr", &format!("127.0.0.1:{rport}")]);

    // Load: successes on every provider, repeats, a conflict, invalid messages, an unknown
    // found by lookup, an unknown that needs a person, a lost publish healed by the sweeper.
    let found = intent("email.send", 900).seal(&secret()).expect("seal");
    let review = intent("payment_order.create", 901)
        .seal(&secret())
        .expect("seal");
    fleet
        .sandbox
        .control()
        .set_faults_json(&json!({"lookup_disabled": ["bank"], "rules": [
            {"mode": "accept_then_timeout", "key": found.key.as_str(), "hold_ms": 30000},
            {"mode": "accept_then_timeout", "key": review.key.as_str(), "hold_ms": 30000}]}))
        .await
        .expect("faults");
    let producer = fleet.producer().await;
    let actions = ["email.send", "ticket.create", "payment_order.create"];
    let batch: Vec<Intent> = (0..60)
        .map(|n| intent(actions[n % 3], n))
        .chain((0..10).map(|n| intent(actions[n % 3], n)))
        .collect();
    producer.enqueue_many(batch).await.expect("enqueue");
    for env in [&found, &review] {
        fleet
            .publish_raw(env.intent.identity.action_type.as_str(), &env.to_bytes())
            .await;
    }
    let mut conflicting = intent("email.send", 1);
    conflicting.payload.insert("changed".into(), json!(true));
    fleet
        .publish_raw(
            "email.send",
            &conflicting.seal(&secret()).expect("seal").to_bytes(),
        )
        .await;
    fleet
        .publish_raw(
            "ticket.create",
            &intent("email.send", 5)
                .seal(&secret())
                .expect("seal")
                .to_bytes(),
        )
        .await;
    fleet.publish_raw("email.send", b"not json").await;
    let lost = intent("ticket.create", 950).seal(&secret()).expect("seal");
    fleet
        .db
        .journal()
        .record(&lost, "crashed-producer")
        .await
        .expect("record");

    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {REPO}/dashboards/prometheus/alerts.yml\nscrape_configs:\n\
         \x20 - job_name: oncely-worker\n    static_configs:\n      - targets: [\"127.0.0.1:{wport}\"]\n\
         \x20 - job_name: oncely-reconciler\n    static_configs:\n      - targets: [\"127.0.0.1:{rport}\"]\n\
         \x20 - job_name: rabbitmq\n    metrics_path: /metrics/per-object\n    static_configs:\n      - targets: [\"127.0.0.1:15692\"]\n"
    );
    let config_path = fleet.dir.join("prometheus.yml");
    std::fs::write(&config_path, config).expect("write config");
    let log = std::fs::File::create(fleet.dir.join("prometheus.log")).expect("log");
    let _prometheus = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            fleet.dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus");

    eventually(
        "the load to settle (incl. a review and a found unknown)",
        Duration::from_secs(90),
        || async {
            let found_done = fleet
                .op(&found.key)
                .await
                .is_some_and(|o| o.status == Status::Succeeded);
            let reviewed = !fleet
                .db
                .journal()
                .reviews_of(&review.key)
                .await
                .expect("reviews")
                .is_empty();
            let lost_done = fleet
                .op(&lost.key)
                .await
                .is_some_and(|o| o.status == Status::Succeeded);
            (found_done && reviewed && lost_done && fleet.count("succeeded").await >= 62)
                .then_some(())
        },
    )
    .await;

    let panels = panel_exprs();
    let alerts = alert_exprs();
    assert!(
        panels.len() >= 10 && alerts.len() >= 6,
        "read {} panels and {} alerts",
        panels.len(),
        alerts.len()
    );
    // Every panel returns series (histogram rates need a few scrapes: poll with a deadline).
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut empty = Vec::new();
        for (title, expr) in &panels {
            match query(pport, expr).await {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => empty.push(format!("{title}: {expr} → no series")),
                Err(e) => empty.push(format!("{title}: {expr} → {e}")),
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "panels without series:\n{}",
            empty.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Every metric name in a panel or an alert is one Prometheus scraped.
    let scraped: BTreeSet<String> = {
        let body = http_get(pport, "/api/v1/label/__name__/values")
            .await
            .expect("names");
        let v: Value = serde_json::from_str(&body).expect("json");
        v["data"]
            .as_array()
            .expect("names")
            .iter()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect()
    };
    let mut unknown = Vec::new();
    for (what, expr) in panels.iter().chain(alerts.iter()) {
        for name in metric_names(expr) {
            if !scraped.contains(&name) {
                unknown.push(format!("{what}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "names the fleet never exported: {unknown:?}"
    );
    // Every alert expression evaluates, and every rule is loaded and healthy.
    for (name, expr) in &alerts {
        query(pport, expr)
            .await
            .unwrap_or_else(|e| panic!("alert {name}: {e}"));
    }
    let rules: Value =
        serde_json::from_str(&http_get(pport, "/api/v1/rules").await.expect("rules"))
            .expect("json");
    let mut seen = 0;
    for g in rules["data"]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            seen += 1;
            assert_eq!(
                r["health"],
                json!("ok"),
                "rule {}: {}",
                r["name"],
                r["lastError"]
            );
        }
    }
    assert_eq!(seen, alerts.len(), "every alert in the file is loaded");
}
