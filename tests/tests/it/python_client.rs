//! The Python client package (`clients/python`) runs its own tests against a real
//! gateway with real workers, and passes `mypy --strict`.

use oncely_core::config::{ApprovalRule, Config};
use oncely_tests::fleet::{Fleet, FleetOptions};
use oncely_tests::gateway::{
    Gateway, TOKEN_A, TOKEN_B, TOKEN_LIMITED, TokenSpec, with_email_schema,
};
use std::time::Duration;

/// Tenant `acme`, may approve and reject its held actions.
const TOKEN_APPROVER: TokenSpec = TokenSpec {
    token: "token-acme-approver",
    tenant: "acme",
    actions: None,
    quota: None,
    approve: true,
};

/// The email schema, and every `payment_order.create` held for approval (the client's
/// approve and reject tests; no other test of it sends a payment).
fn configure(config: &mut Config) {
    with_email_schema(config);
    if let Some(p) = config.actions.get_mut("payment_order.create") {
        p.approval = vec![ApprovalRule {
            name: "every-payment".into(),
            when: None,
            first_contact: None,
            four_eyes: None,
            timeout: Duration::from_secs(3600),
        }];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_passes_its_tests_against_a_running_gateway() {
    let fleet = Fleet::with(FleetOptions {
        configure: Some(configure),
        ..FleetOptions::default()
    })
    .await;
    let _workers: Vec<_> = (0..2).map(|_| fleet.worker()).collect();
    let gw = Gateway::start(&fleet, &[TOKEN_A, TOKEN_B, TOKEN_LIMITED, TOKEN_APPROVER]).await;
    let package = concat!(env!("CARGO_MANIFEST_DIR"), "/../clients/python");
    let out = tokio::process::Command::new(oncely_tests::python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(package)
        .env(
            "ONCELY_GATEWAY_URL",
            format!("http://127.0.0.1:{}", gw.port),
        )
        .env("ONCELY_GATEWAY_TOKEN", TOKEN_A.token)
        .env("ONCELY_GATEWAY_TOKEN_B", TOKEN_B.token)
        .env("ONCELY_GATEWAY_TOKEN_LIMITED", TOKEN_LIMITED.token)
        .env("ONCELY_GATEWAY_TOKEN_APPROVER", TOKEN_APPROVER.token)
        .output()
        .await
        .expect("pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pytest failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains("skipped"),
        "the server tests must run, not skip:\n{stdout}"
    );
    let mypy = tokio::process::Command::new(oncely_tests::python())
        .args([
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir=/dev/null",
            "src",
        ])
        .current_dir(package)
        .output()
        .await
        .expect("mypy");
    assert!(
        mypy.status.success(),
        "mypy --strict:\n{}",
        String::from_utf8_lossy(&mypy.stdout)
    );
}
