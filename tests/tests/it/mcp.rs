//! The MCP tool server, driven by the official Python MCP SDK (PyPI `mcp`): a client none
//! of us wrote, over streamable HTTP and stdio, against real workers and the sandbox.

use oncely_tests::fleet::{Fleet, FleetOptions, SECRET, binary};
use oncely_tests::gateway::{Gateway, TOKEN_A, with_email_schema};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_mcp_sdk_calls_a_tool_five_times_and_one_email_is_sent() {
    let fleet = Fleet::with(FleetOptions {
        configure: Some(with_email_schema),
        ..FleetOptions::default()
    })
    .await;
    let _workers: Vec<_> = (0..2).map(|_| fleet.worker()).collect();
    let gw = Gateway::start(&fleet, &[TOKEN_A]).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/mcp_agent.py");
    let out = tokio::process::Command::new(oncely_tests::python())
        .arg(script)
        .env(
            "ONCELY_MCP_URL",
            format!("http://127.0.0.1:{}/mcp", gw.port),
        )
        .env("ONCELY_GATEWAY_TOKEN", TOKEN_A.token)
        .env("ONCELY_GATEWAY_BIN", binary("oncely-gateway"))
        .env("ONCELY_CONFIG", &fleet.config_path)
        .env("ONCELY_GATEWAY_TOKENS_FILE", &gw.tokens_file)
        .env("ONCELY_KEY_SECRET", SECRET)
        .output()
        .await
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mcp_agent.py failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    let last = stdout.lines().last().expect("output");
    let line: Value = serde_json::from_str(last).expect("keys line");
    let keys = line["keys"].as_array().expect("keys");
    let cancelled = line["cancelled"].as_array().expect("cancelled keys");
    assert_eq!(
        cancelled.len(),
        3,
        "one scheduled and cancelled per scenario"
    );
    assert_eq!(keys.len(), 6, "two queued per scenario, three scenarios");
    oncely_tests::eventually(
        "every queued email was sent",
        std::time::Duration::from_secs(60),
        || async {
            let effects = fleet.sandbox.effects();
            keys.iter()
                .all(|k| effects.count(k.as_str().unwrap_or_default()) == 1)
                .then_some(())
        },
    )
    .await;
    let effects = fleet.sandbox.effects();
    // One email per queued key, however many times the tool was called; a revision bump is
    // absent from this script, so nothing else was sent.
    assert_eq!(
        effects.total, 6,
        "one email per distinct call, not per call"
    );
    assert!(effects.duplicates().next().is_none());
    for k in cancelled {
        let k = k.as_str().unwrap_or_default();
        assert_eq!(
            effects.count(k),
            0,
            "{k}: cancelled through action_cancel, never sent"
        );
        let key = oncely_core::IdempotencyKey::parse(k).expect("key");
        let op = fleet.op(&key).await.expect("recorded");
        assert_eq!(op.status, oncely_core::Status::Cancelled);
    }
    let logs = gw.proc.logs();
    assert!(
        !logs.contains("bob@example.test") && !logs.contains("Invoice 42"),
        "no payload in the gateway's log:\n{logs}"
    );
}
