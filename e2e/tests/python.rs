//! The Python package (`python/`, issue 33): its wheel built from this workspace's release build and
//! its tests (pytest, the example notebook included) run in a throwaway venv, by
//! `scripts/test-python.sh`. Here so that the README's test command (`scripts/test.sh`) and `cargo
//! test --release --workspace` run them; a missing tool (maturin, pandas, pytest, ...) fails naming
//! `scripts/setup.sh`, which installs them.

use std::path::PathBuf;
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e sits in the workspace").to_owned()
}

/// The target directory this test was built into (`<target>/release/deps/python-*`), so that the
/// wheel reuses the same build and the tests find the same binaries.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    exe.ancestors().nth(3).expect("the test runs from <target>/<profile>/deps").to_owned()
}

#[test]
fn the_python_package_passes_its_tests() {
    let status = Command::new("bash")
        .arg(workspace_root().join("scripts/test-python.sh"))
        .env("CARGO_TARGET_DIR", target_dir())
        .status()
        .expect("bash runs scripts/test-python.sh");
    assert!(status.success(), "scripts/test-python.sh failed ({status}): see its output above");
}
