//! The Python client package (`clients/python`) runs its own tests against a real
//! gateway with real workers, and passes `mypy --strict`.

use oncely_tests::fleet::{Fleet, FleetOptions};
use oncely_tests::gateway::{
    Gateway, TOKEN_A, TOKEN_APPROVER, TOKEN_B, TOKEN_LIMITED, with_held_payments,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_passes_its_tests_against_a_running_gateway() {
    let fleet = Fleet::with(FleetOptions {
        configure: Some(with_held_payments),
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
