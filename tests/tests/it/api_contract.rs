//! The HTTP API against its own OpenAPI document: schemathesis (PyPI, in the project's
//! venv) with every check, its examples, coverage, fuzzing and stateful phases (create →
//! status → wait → cancel, through the document's links), against a real gateway in front
//! of real workers. It must end with no failure and no warning.

use oncely_tests::fleet::{Fleet, FleetOptions};
use oncely_tests::gateway::{Gateway, TOKEN_A, TOKEN_APPROVER, with_held_payments};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_against_a_running_gateway() {
    let fleet = Fleet::with(FleetOptions {
        configure: Some(with_held_payments),
        ..FleetOptions::default()
    })
    .await;
    let _worker = fleet.worker();
    // Long-polls of at most 1 s: the fuzzer asks for many.
    let gw = Gateway::start_with(
        &fleet,
        &[TOKEN_A, TOKEN_APPROVER],
        &[],
        &["--max-wait", "1s"],
    )
    .await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/schemathesis");
    let examples = std::env::var("ONCELY_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "40".into());
    let out = tokio::process::Command::new(oncely_tests::python())
        .args([
            "-m",
            "schemathesis.cli",
            "--no-color",
            "--config-file",
            "schemathesis.toml",
            "run",
        ])
        .arg(format!("http://127.0.0.1:{}/openapi.json", gw.port))
        .args([
            "--checks",
            "all",
            "--max-examples",
            &examples,
            "--seed",
            "20261208",
            "--workers",
            "2",
        ])
        .current_dir(dir)
        .env("ONCELY_ST_TOKEN", TOKEN_A.token)
        .env("ONCELY_ST_APPROVER", TOKEN_APPROVER.token)
        .output()
        .await
        .expect("schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "schemathesis failed:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("WARNINGS"),
        "schemathesis warned:\n{stdout}"
    );
    // The fuzzer reached the workers: valid actions were recorded and ran.
    let journal = fleet.db.journal();
    let counts = journal.count_by_status().await.expect("count");
    let succeeded = counts
        .iter()
        .find(|(s, _)| s == "succeeded")
        .map_or(0, |(_, c)| *c);
    assert!(
        succeeded > 0,
        "no generated action reached a worker: {counts:?}"
    );
}
