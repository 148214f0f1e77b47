//! What the e2e tests share: finding the workspace's binaries they start.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

#[path = "../../../allocator/tests/support/listening.rs"]
pub mod listening;

/// The service credential of the stacks these tests start: the allocator and the inference server
/// require it and the control service presents it, as `scripts/stack.sh` and compose run them.
pub const SERVICE_TOKEN: &str = "e2e-service-token";

/// Hands [`SERVICE_TOKEN`] to whichever binary `command` starts (each reads only its own
/// variables), and keeps any token of the caller's environment out.
pub fn with_service_token(command: &mut Command) -> &mut Command {
    for variable in [
        "ALLOCATOR_SERVICE_TOKEN",
        "INFERENCE_SERVICE_TOKEN",
        "CONTROL_ALLOCATOR_SERVICE_TOKEN",
        "CONTROL_INFERENCE_SERVICE_TOKEN",
    ] {
        command.env(variable, SERVICE_TOKEN).env_remove(format!("{variable}_FILE"));
    }
    command.env_remove("ALLOCATOR_PREVIOUS_SERVICE_TOKEN").env_remove("INFERENCE_PREVIOUS_SERVICE_TOKEN")
}

/// The directory of the workspace's binaries: the target profile directory (`target/release`),
/// the grandparent of this test's executable (`target/release/deps/<test>-<hash>`).
pub fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own executable: {e}"));
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap_or_else(|| panic!("{} is not in <target>/<profile>/deps", exe.display()))
        .to_path_buf()
}

/// The binary `name` of another workspace package, built beside this test. `cargo test --release
/// --workspace` builds every member's binaries before it runs any test; with `-p e2e` alone they
/// must have been built before, and a missing one fails here, naming the command.
pub fn workspace_binary(name: &str) -> PathBuf {
    let path = binaries_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: this test starts the real `{name}` binary of the workspace; build the binaries with \
         `cargo build --release --workspace` (or run the tests with `cargo test --release --workspace`, which \
         builds them first)",
        path.display()
    );
    path
}
