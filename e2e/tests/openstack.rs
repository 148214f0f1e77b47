//! The OpenStack Nova plug-in (`openstack/`, issue 57): its tests, unit and functional, run in the
//! pinned Nova 34 / Placement 16 venv (`scripts/openstack-env.sh`, which `scripts/setup.sh`
//! runs). The functional ones boot servers through Nova's real API, conductor, scheduler and
//! Placement in Nova's own in-process harness, with the plug-in's weigher and notification listener
//! configured in `nova.conf` and this build's three services as the real binaries. Here so that the
//! README's test command runs them.

use std::path::PathBuf;
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e sits in the workspace").to_owned()
}

#[test]
fn the_nova_plug_in_passes_its_tests_in_novas_harness() {
    let root = workspace_root();
    // Up to date after the set-up: a hash check, no install.
    let venv = Command::new("bash")
        .arg(root.join("scripts/openstack-env.sh"))
        .arg("--print")
        .output()
        .expect("bash runs scripts/openstack-env.sh");
    assert!(
        venv.status.success(),
        "scripts/openstack-env.sh failed ({}); run scripts/setup.sh first:\n{}",
        venv.status,
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8_lossy(&venv.stdout).trim().to_owned();
    let status = Command::new(root.join(&python))
        .args(["-m", "unittest", "discover", "-s", "openstack/tests", "-t", "openstack", "-v"])
        .current_dir(&root)
        .env("LIFETIME_ALLOC_BIN_DIR", test_support::binaries::binaries_dir())
        .status()
        .expect("the Nova venv's python runs");
    assert!(status.success(), "the Nova plug-in's tests failed ({status}): see their output above");
}
