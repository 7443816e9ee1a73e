//! The fail-point worker: `oncely-worker` built with its `failpoints` feature, in a target
//! directory of its own (`target/failpoints`), for the chaos run.
//!
//! Why a separate build: Cargo unifies features across the packages of one build, so a
//! tests crate that turned the worker's `failpoints` feature on as a dependency would turn
//! it on in every workspace build of the worker — and the shipped binary could abort on an
//! environment variable. Here nothing depends on the feature; the chaos run builds the
//! fail-point worker by itself, into a directory the shipped build never reads.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The fail-point worker, built once per process: the path of its binary.
pub fn path() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow::anyhow!("building the fail-point worker: {e}"))
}

/// Where the fail-point worker's binary is (or will be), without building it.
pub fn location() -> anyhow::Result<PathBuf> {
    Ok(target_dir()?.join(profile()?).join("oncely-worker"))
}

fn build() -> anyhow::Result<PathBuf> {
    let dir = target_dir()?;
    let dir_arg = dir.to_string_lossy().into_owned();
    eprintln!(
        "cargo build -p oncely-worker --features failpoints --target-dir {dir_arg} (the fail-point worker)"
    );
    cargo_build_worker(&["--features", "failpoints", "--target-dir", &dir_arg])?;
    let path = location()?;
    anyhow::ensure!(
        path.exists(),
        "{} not found after the build",
        path.display()
    );
    Ok(path)
}

/// `cargo build -p oncely-worker --bin oncely-worker` in the profile of the running
/// executable, with `extra` arguments (no extra: the plain worker, in the usual target
/// directory).
pub fn cargo_build_worker(extra: &[&str]) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new(cargo());
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace()?.join("Cargo.toml"))
        .args(["-p", "oncely-worker", "--bin", "oncely-worker"]);
    match profile()?.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let status = cmd.args(extra).status()?;
    anyhow::ensure!(
        status.success(),
        "cargo build -p oncely-worker {extra:?} failed"
    );
    Ok(())
}

/// The cargo that runs us (`CARGO`), else the one that built us, else `cargo` on the `PATH`.
fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO").map(PathBuf::from))
        .filter(|c| c.exists())
        .unwrap_or_else(|| PathBuf::from("cargo"))
}

/// The workspace root (the tests crate's parent directory).
fn workspace() -> anyhow::Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow::anyhow!("no workspace directory"))
}

/// `<workspace>/target/failpoints`.
fn target_dir() -> anyhow::Result<PathBuf> {
    Ok(workspace()?.join("target").join("failpoints"))
}

/// The profile directory the running executable was built into: `debug`, `release` or a
/// custom profile's name (a test executable sits one level lower, in `deps`).
fn profile() -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent();
    if dir.and_then(Path::file_name).is_some_and(|n| n == "deps") {
        dir = dir.and_then(Path::parent);
    }
    Ok(dir
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_owned())
}
