//! The OpenStack plug-ins (`openstack/`, issues 57 and 59): their tests, each in its pinned venv
//! (`scripts/openstack-env.sh`, which `scripts/setup.sh` runs). The Nova ones (unit and
//! functional) boot servers through Nova 34's real API, conductor, scheduler and Placement in Nova's
//! own in-process harness, with the plug-in's weigher and notification listener configured in
//! `nova.conf` and this build's three services as the real binaries. The Watcher ones run the
//! consolidation strategy in Watcher 17's own functional harness (its API, decision engine and
//! applier against its emulated Nova and Placement) with the allocator binary. Here so that the
//! README's test command runs them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e sits in the workspace").to_owned()
}

/// The python of venv `name` (`nova` or `watcher`), up to date after the set-up (a hash check).
fn venv_python(root: &Path, name: &str) -> PathBuf {
    let venv = Command::new("bash")
        .arg(root.join("scripts/openstack-env.sh"))
        .args(["--print", name])
        .output()
        .expect("bash runs scripts/openstack-env.sh");
    assert!(
        venv.status.success(),
        "scripts/openstack-env.sh --print {name} failed ({}); run scripts/setup.sh first:\n{}",
        venv.status,
        String::from_utf8_lossy(&venv.stderr)
    );
    root.join(String::from_utf8_lossy(&venv.stdout).trim())
}

/// `python -m unittest discover` of `start` (under `openstack/`) in venv `name`.
fn run_suite(name: &str, start: &str) {
    let root = workspace_root();
    let status = Command::new(venv_python(&root, name))
        .args(["-m", "unittest", "discover", "-s", start, "-t", "openstack", "-v"])
        .current_dir(&root)
        .env("LIFETIME_ALLOC_BIN_DIR", test_support::binaries::binaries_dir())
        .env("LIFETIME_ALLOC_REQUIRE_WATCHER", if name == "watcher" { "1" } else { "0" })
        .status()
        .expect("the venv's python runs");
    assert!(status.success(), "the {name} plug-in's tests failed ({status}): see their output above");
}

#[test]
fn the_nova_plug_in_passes_its_tests_in_novas_harness() {
    run_suite("nova", "openstack/tests");
}

#[test]
fn the_watcher_strategy_passes_its_tests_in_watchers_harness() {
    run_suite("watcher", "openstack/tests/watcher");
}
